"""The torchrig_files module (roles/torchrig/library/torchrig_files.py), run by Ansible on
this machine: files written, made and removed in one call, changed only when they differ,
links replaced and never followed."""

from __future__ import annotations

import base64
import grp
import json
import os
import pwd
import stat
from pathlib import Path

import pytest
from conftest import run

ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name


def files(entries: list[dict], check: bool = False, diff: bool = False) -> dict:
    args = ["ansible", "localhost", "-c", "local", "-M", "roles/torchrig/library", "-m", "torchrig_files",
            "-a", json.dumps({"files": entries})] + (["--check"] if check else []) + (["--diff"] if diff else [])
    proc = run(args, env={"ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json"}, timeout=120)
    return json.loads(proc.stdout[proc.stdout.index("{"):])["plays"][0]["tasks"][0]["hosts"]["localhost"]


def entry(path: Path, **kw) -> dict:
    return {"path": str(path), "owner": ME, "group": MY_GROUP, **kw}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_files_are_written_once_then_left_alone(tmp_path: Path):
    conf, env = tmp_path / "job.service.d" / "job.conf", tmp_path / "job.env"
    todo = [entry(conf.parent, state="directory", mode="0755"), entry(conf, content="[Service]\n"),
            entry(env, content="A=1\n", mode="0640")]
    first = files(todo)
    assert first["changed_paths"] == [str(conf.parent), str(conf), str(env)], first
    assert conf.read_text() == "[Service]\n" and env.read_text() == "A=1\n"
    assert (mode(conf.parent), mode(conf), mode(env)) == (0o755, 0o644, 0o640)
    again = files(todo)
    assert not again["changed"] and again["changed_paths"] == [], again
    # A directory's mode alone changes it, and keeps what is in it.
    moved = files([entry(conf.parent, state="directory", mode="0700")])
    assert moved["changed_paths"] == [str(conf.parent)] and mode(conf.parent) == 0o700
    assert conf.read_text() == "[Service]\n"


def test_a_new_content_or_mode_changes_only_that_file(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    files([entry(a, content="1\n"), entry(b, content="2\n")])
    got = files([entry(a, content="1\n", mode="0600"), entry(b, content="3\n")])
    assert got["changed_paths"] == [str(a), str(b)]
    assert (a.read_text(), mode(a), b.read_text(), mode(b)) == ("1\n", 0o600, "3\n", 0o644)


def test_check_mode_says_what_would_change_and_changes_nothing(tmp_path: Path):
    a, gone = tmp_path / "a", tmp_path / "old-end"
    gone.write_text("{}")
    got = files([entry(a, content="1\n"), {"path": str(gone), "state": "absent"}], check=True)
    assert got["changed_paths"] == [str(a), str(gone)]
    assert not a.exists() and gone.exists()


def test_check_mode_previews_files_of_a_user_not_made_yet_and_a_real_run_names_it(tmp_path: Path):
    # train.yml --check: the job's user is made by an earlier task, skipped in check mode.
    run_dir, env = tmp_path / "runs" / "job", tmp_path / "job.env"
    env.write_text("A=1\n")
    todo = [entry(run_dir, state="directory", mode="0700", owner="tj-nobody-made-me", group="tj-nobody-made-me"),
            entry(env, content="A=1\n", group="tj-nobody-made-me")]
    got = files(todo, check=True)
    assert not got.get("failed") and got["changed_paths"] == [str(run_dir), str(env)], got
    assert not run_dir.exists() and mode(env) == 0o644
    real = files(todo)
    assert real.get("failed") and real["msg"] == f"{run_dir}: no user tj-nobody-made-me", real


def test_absent_removes_files_links_and_trees_but_not_what_a_link_points_to(tmp_path: Path):
    target = tmp_path / "precious"
    target.write_text("keep")
    link, tree, never = tmp_path / "old-end", tmp_path / "venv", tmp_path / "never"
    link.symlink_to(target)
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / "python").write_text("")
    got = files([{"path": str(p), "state": "absent"} for p in (link, tree, never)])
    assert got["changed_paths"] == [str(link), str(tree)]
    assert not link.is_symlink() and not tree.exists() and target.read_text() == "keep"


def test_a_link_at_a_files_path_is_replaced_not_written_through(tmp_path: Path):
    target, path = tmp_path / "shadow", tmp_path / "job.env"
    target.write_text("secret")
    path.symlink_to(target)
    files([entry(path, content="A=1\n")])
    assert not path.is_symlink() and path.read_text() == "A=1\n" and target.read_text() == "secret"


@pytest.mark.parametrize(("bad", "says"), [
    ({"owner": "tj-no-such-user"}, "no user tj-no-such-user"),
    ({"group": "tj-no-such-group"}, "no group tj-no-such-group"),
])
def test_an_unknown_owner_or_group_is_named_and_nothing_after_it_is_done(tmp_path: Path, bad: dict, says: str):
    first, second = tmp_path / "first", tmp_path / "second"
    got = files([entry(first, content="1"), entry(tmp_path / "bad", content="x", **bad), entry(second, content="2")])
    assert got.get("failed") and got["msg"] == f"{tmp_path / 'bad'}: {says}", got
    assert first.exists() and not (tmp_path / "bad").exists() and not second.exists()


def test_bytes_given_in_base64_are_written_as_they_are_and_bad_base64_is_named(tmp_path: Path):
    key = tmp_path / "keyring.gpg"
    raw = bytes(range(256))
    first = files([entry(key, content_base64=base64.b64encode(raw).decode())])
    assert first["changed_paths"] == [str(key)] and key.read_bytes() == raw
    assert files([entry(key, content_base64=base64.b64encode(raw).decode())])["changed_paths"] == []
    bad = files([entry(key, content_base64="not base64!")])
    assert bad.get("failed") and bad["msg"].startswith(f"{key}: "), bad
    assert key.read_bytes() == raw


def test_diff_shows_each_changed_text_file_before_and_after(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    files([entry(a, content="old\n"), entry(b, content="same\n")])
    got = files([entry(a, content="new\n"), entry(b, content="same\n")], check=True, diff=True)
    assert got["diff"] == [{"before_header": str(a), "after_header": str(a), "before": "old\n", "after": "new\n"}]
    assert a.read_text() == "old\n"
