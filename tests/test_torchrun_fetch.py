"""What comes home from a job's nodes: the listing taken on the node as the job's user
(links never followed), the check of every name a node gives, and the limits on the
total across all nodes, checked before anything moves."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import as_unprivileged
from rolepy import load

job = load("roles/torchrun/filter_plugins/torchrun_job.py", "torchrun_job")
outputs = load("roles/torchrun/module_utils/torchrun_outputs.py", "torchrun_outputs")
record = load("roles/torchrun/module_utils/torchrun_record.py", "torchrun_record")
MB = 1024 * 1024


# --- the names a node gives ---------------------------------------------------------------

@pytest.mark.parametrize("rel", ["result.txt", "output/result.pt", "output/.hidden/cfg.yaml",
                                 "output/..dots../a", "nodes/x y.txt"])
def test_a_name_under_the_run_directory_is_taken(rel: str) -> None:
    assert job.name_problem(rel) == ""


@pytest.mark.parametrize(("rel", "why"), [
    ("../../.ssh/authorized_keys", "'..'"),
    ("output/../../../etc/cron.d/x", "'..'"),
    ("..", "'..'"),
    ("/etc/passwd", "absolute"),
    ("/", "absolute"),
    ("output//x", "empty"),
    ("./x", "'.'"),
    ("output/a\nb", "control character"),
    ("a\\..\\b", "backslash"),
    ("", "empty"),
    (None, "not a string"),
])
def test_a_name_that_leaves_the_results_directory_is_refused(rel, why: str) -> None:
    assert why in job.name_problem(rel)


def listing(*files: tuple[str, int]) -> dict:
    """A listing as torchrun_outputs gives it (module_utils/torchrun_outputs.py)."""
    return {"exists": True, "names": "\0".join(rel for rel, _ in files), "count": len(files),
            "bytes": sum(size for _, size in files),
            "largest": [[rel, size] for rel, size in sorted(files, key=lambda f: -f[1])[:5]],
            "links": [], "links_count": 0}


def test_the_plan_refuses_a_node_that_gives_a_name_outside_the_run_directory() -> None:
    plan = job.fetch_plan({"node1": listing(("result.txt", 10)),
                           "node2": listing(("../../../home/u/.bashrc", 5), ("/etc/shadow", 1), ("ok", 1))},
                          1024, 1000, "j")
    assert plan["refused"] == ['node2: "../../../home/u/.bashrc" (it has an empty, \'.\' or \'..\' part)',
                               'node2: "/etc/shadow" (it is absolute)']
    assert plan["nodes"]["node2"]["count"] == 1 and plan["lists"] == {"node1": "result.txt", "node2": "ok"}
    # A name with a newline is refused, not read as two: the list rsync reads has a name a line.
    split = job.fetch_plan({"node1": listing(("a\nb", 1), ("a", 1))}, 1024, 1000, "j")
    assert split["refused"] == ['node1: "a\\nb" (it holds a control character or a backslash)']
    # The largest files a node names are checked too before a message names them.
    over = job.fetch_plan({"node1": {**listing(("ok", 2 * MB)), "largest": [["../x", 2 * MB], ["ok", 2 * MB]]}},
                          1, 1000, "j")["over"]
    assert "node1:ok" in over and "../x" not in over


def test_the_limits_hold_for_the_total_across_all_nodes_and_name_the_setting() -> None:
    two = {"node1": listing(("output/a.bin", 600 * MB)), "node2": listing(("output/a.bin", 600 * MB))}
    plan = job.fetch_plan(two, 1024, 1000, "big")
    assert plan["bytes"] == 1200 * MB and plan["files"] == 2
    assert "Job big left 1.17 GiB, more than torchrun_fetch_limit_mb (1,024 MB) across its 2 nodes" in plan["over"]
    assert "node1:output/a.bin (600.0 MiB)" in plan["over"]
    assert job.fetch_plan(two, 1200, 1000, "big")["over"] == ""
    many = {"node1": listing(*[(f"f{i}", 1) for i in range(6)]), "node2": listing(*[(f"f{i}", 1) for i in range(5)])}
    over = job.fetch_plan(many, 1024, 10, "many")["over"]
    assert "11 files, more than torchrun_fetch_limit_files (10)" in over
    assert "torchrun_fetch_limit_mb" not in over.split("Fetch it")[0]
    assert job.fetch_plan(many, 1024, 11, "many")["over"] == ""


def test_the_plan_gives_rsync_a_list_for_each_node_with_files() -> None:
    plan = job.fetch_plan({"node1": listing(("output/a.bin", 1), ("results.txt", 1)), "node2": listing()},
                          1024, 10, "j", "output")
    assert plan["lists"] == {"node1": "output/a.bin\nresults.txt"}
    assert plan["nodes"]["node1"]["top"] == ["results.txt"] and plan["nodes"]["node1"]["has_output"]
    assert plan["nodes"]["node2"] == {"count": 0, "bytes": 0, "top": [], "has_output": False, "links": 0,
                                      "link_names": []}


# --- the listing on the node --------------------------------------------------------------

def test_the_run_record_looks_at_the_run_directory_without_following_a_link(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "link").symlink_to(run)
    assert record.run_dir(str(run)) == {"isdir": True, "owner": record.pwd.getpwuid(run.stat().st_uid).pw_name}
    assert record.run_dir(str(tmp_path / "link")) == {"isdir": False, "owner": ""}
    assert record.run_dir(str(tmp_path / "none")) == {"isdir": False, "owner": ""}
    (tmp_path / "job.run").write_text("20261207T220000Z\n")
    assert record.run_id(str(tmp_path / "job.run")) == "20261207T220000Z"
    assert record.run_id(str(tmp_path / "none.run")) == "" and record.run_id(None) == ""


def test_the_listing_never_follows_a_link(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "output" / "sub").mkdir(parents=True)
    (run / "output" / "result.pt").write_bytes(b"x" * 100)
    (run / "output" / "sub" / "notes.txt").write_text("hi")
    # A job swaps its outputs for links to root-only files and to a directory outside.
    (run / "output" / "shadow").symlink_to("/etc/shadow")
    (run / "output" / "keys").symlink_to("/etc/ssh")
    (run / "output" / "sub" / "up").symlink_to(tmp_path)
    (tmp_path / "outside.txt").write_text("not the job's")
    got = outputs.list_outputs(str(run))
    assert got["names"].split("\0") == ["output/result.pt", "output/sub/notes.txt"]
    assert got["count"] == 2 and got["bytes"] == 102 and got["largest"][0] == ["output/result.pt", 100]
    assert got["links_count"] == 3 and sorted(got["links"]) == ["output/keys", "output/shadow", "output/sub/up"]


def test_the_listing_leaves_checkpoints_and_temp_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "output" / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "ckpt_1.pt").write_bytes(b"c" * 10)
    (run / "output" / "checkpoints" / "epoch1.ckpt").write_bytes(b"c" * 10)
    (run / "output" / "model.pt").write_bytes(b"m")
    (run / "output" / "model.pt").chmod(0o600)
    (run / "output" / "part.tmp").write_bytes(b"t")
    got = outputs.list_outputs(str(run), ["checkpoints"])
    assert (got["names"], got["count"], got["bytes"]) == ("output/model.pt", 1, 1)
    every = outputs.list_outputs(str(run), [])
    assert every["names"].split("\0") == ["checkpoints/ckpt_1.pt", "output/checkpoints/epoch1.ckpt",
                                          "output/model.pt"]


def test_a_run_directory_that_is_a_link_or_missing_lists_nothing(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to("/etc")
    assert outputs.list_outputs(str(tmp_path / "link"))["names"] == ""
    assert not outputs.list_outputs(str(tmp_path / "none"))["exists"]


def test_a_directory_the_reader_cannot_open_is_named(open_tmp: Path) -> None:
    # Read as a user root's override of file modes does not cover, as the job's user reads.
    run = open_tmp / "run"
    (run / "closed").mkdir(parents=True)
    (run / "closed").chmod(0)
    assert as_unprivileged(lambda: outputs.list_outputs(str(run))["unreadable"]) == ["closed"]
