"""roles/torchrun/files/results_home.py, run as the fetch runs it: a run's results directory
made 0700, the job's results pointed at it, the journals and the lists of files to fetch
written 0600, once; the results of a torchrig from before runs had directories of their own
kept whole; bad node names refused."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "roles/torchrun/files/results_home.py"


def home(fetch_dir: Path, run_id: str, journals: dict[str, list[str]],
         lists: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(fetch_dir), run_id, "20261206T000000Z"],
                          input=json.dumps({"journals": journals, "lists": lists or {}}), capture_output=True,
                          text=True, timeout=60, check=False)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_run_gets_its_directory_and_journals_once(tmp_path: Path):
    fetch_dir = tmp_path / "results" / "job"
    first = home(fetch_dir, "20261206T010000Z", {"node1": ["a", "a2"], "node2": ["b"]},
                 {"node1": "output/x.bin\nresults.txt"})
    assert first.returncode == 0 and json.loads(first.stdout) == {"changed": True, "moved": False}, first
    run = tmp_path / "results" / "job.runs" / "20261206T010000Z"
    assert os.readlink(fetch_dir) == "job.runs/20261206T010000Z"
    assert (run / "logs" / "node1.log").read_text() == "a\na2\n" and (run / "nodes").is_dir()
    # rsync's --files-from for node1; node2 had nothing to fetch.
    assert (run / "logs" / "node1.files").read_text() == "output/x.bin\nresults.txt\n"
    assert not (run / "logs" / "node2.files").exists()
    assert {mode(p) for p in (run.parent, run, run / "logs", run / "nodes")} == {0o700}
    assert mode(run / "logs" / "node2.log") == mode(run / "logs" / "node1.files") == 0o600
    again = home(fetch_dir, "20261206T010000Z", {"node1": ["a", "a2"], "node2": ["b"]},
                 {"node1": "output/x.bin\nresults.txt"})
    assert json.loads(again.stdout) == {"changed": False, "moved": False}
    rerun = home(fetch_dir, "20261206T020000Z", {"node1": ["c"]})
    assert json.loads(rerun.stdout)["changed"] and os.readlink(fetch_dir) == "job.runs/20261206T020000Z"
    assert (run / "logs" / "node1.log").read_text() == "a\na2\n"


def test_results_of_an_older_torchrig_are_kept_whole(tmp_path: Path):
    fetch_dir = tmp_path / "job"
    (fetch_dir / "nodes").mkdir(parents=True)
    (fetch_dir / "result.txt").write_text("kept")
    done = home(fetch_dir, "20261206T010000Z", {})
    assert json.loads(done.stdout) == {"changed": True, "moved": True}, done
    assert (tmp_path / "job.runs" / "earlier-20261206T000000Z" / "result.txt").read_text() == "kept"
    assert fetch_dir.is_symlink()


def test_a_node_name_that_is_no_file_name_is_refused_before_anything_is_made(tmp_path: Path):
    for bad in ("../x", ".."):
        for journals, lists in (({bad: ["x"]}, {}), ({}, {bad: "x"})):
            done = home(tmp_path / "job", "20261206T010000Z", journals, lists)
            assert done.returncode == 2 and "no file names" in done.stderr, done
    assert list(tmp_path.iterdir()) == []
