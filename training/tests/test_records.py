"""The metrics records after a full disk or a power loss (issue 31, item 8): a last line cut
short no longer makes every resume fail; the file is rewritten atomically."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from test_trainer import metrics, restore_process_state, trainer  # noqa: F401 (fixture)
from torchrig.contract import FILES


def test_a_resume_skips_a_last_line_cut_short(tmp_path: Path, caplog):
    """Stopped at step 50 with half a record at the end: the resume trains on and the
    file reads as the uninterrupted run's, the broken line reported."""
    flags = {"max_steps": 60, "optimizer": "sgd", "lr": 0.05}
    whole = tmp_path / "whole"
    assert trainer(whole, **flags).train() == 0
    split = tmp_path / "split"
    assert trainer(split, **{**flags, "max_steps": 50}).train() == 0
    with (split / FILES["metrics"]).open("a") as f:
        f.write('{"split": "train", "step": 51, "epo')  # the disk filled here
    caplog.set_level(logging.WARNING, logger="torchrig")
    resumed = trainer(split, **flags)
    assert resumed.resumed_from == 50
    assert resumed.train() == 0
    assert metrics(split) == metrics(whole)
    assert f"{FILES['metrics']}: last line" in caplog.text
    assert "is not a whole record" in caplog.text


def test_the_rewrite_replaces_the_file_whole(tmp_path: Path):
    """The trim on resume writes a new file and renames it over the old one: a crash
    during it leaves the old file, never a half-written one; no temp file is left."""
    run_dir = tmp_path / "run"
    assert trainer(run_dir, max_steps=12, checkpoint_every=10).train() == 0
    before = (run_dir / FILES["metrics"]).stat().st_ino
    resumed = trainer(run_dir, max_steps=12, checkpoint_every=10)
    assert resumed.resumed_from == 12
    assert resumed.train() == 0
    assert (run_dir / FILES["metrics"]).stat().st_ino != before
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".")) == []


def test_read_records_keeps_whole_lines_and_names_the_broken_ones(tmp_path: Path):
    # Imported here: the two tests above run against any version of the package.
    from torchrig import records

    path = tmp_path / FILES["metrics"]
    good = [{"split": "train", "step": 1, "loss": 1.0}, {"split": "eval", "step": 1, "loss": 0.5}]
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in good)
                     + b"[1, 2]\n\n" + json.dumps({"split": "train", "step": 2}).encode() + b"\n"
                     + b'{"split": "tr\x00\xff')
    got, skipped = records.read_records(path)
    assert got == [*good, {"split": "train", "step": 2}]
    assert [s.split(": ", 1)[1].split(" (")[0] for s in skipped] == [
        "line 3 is not a whole record", "last line 6 is not a whole record"]
    assert records.read_records(tmp_path / "none.jsonl") == ([], [])
