"""A job's data (train.yml's -e data=PATH): the manifest and digest the controller and the
nodes compute (torchrig.cluster's module_utils/torchrun_data.py), the controller's cache of file hashes, and
which staged versions a node removes above its size limit."""

from __future__ import annotations

import hashlib
import os

import pytest
from rolepy import load, shared

data = shared("torchrun_data")
DATA_DIR = load("roles/torchrig/filter_plugins/torchrig_contract.py", "torchrig_contract").contract()["env"]["data_dir"]


def tree(root, files):
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return root


def test_the_manifest_lists_names_sizes_and_hashes_in_name_order(tmp_path):
    tree(tmp_path, {"b.bin": b"bb", "a/x.txt": b"x", "a/y/z": b""})
    assert data.manifest(str(tmp_path)) == [
        ["a/"], ["a/x.txt", 1, hashlib.sha256(b"x").hexdigest()], ["a/y/"],
        ["a/y/z", 0, hashlib.sha256(b"").hexdigest()], ["b.bin", 2, hashlib.sha256(b"bb").hexdigest()]]


def test_the_digest_changes_with_a_files_content_name_or_an_empty_directory(tmp_path):
    root = tree(tmp_path / "d", {"a": b"1", "b": b"2"})
    first = data.digest(data.manifest(str(root)))
    # The same content elsewhere, written at another time: the same digest.
    assert data.digest(data.manifest(str(tree(tmp_path / "e", {"b": b"2", "a": b"1"})))) == first
    (root / "a").write_bytes(b"3")
    assert data.digest(data.manifest(str(root))) != first
    (root / "a").write_bytes(b"1")
    assert data.digest(data.manifest(str(root))) == first
    (root / "a").rename(root / "c")
    assert data.digest(data.manifest(str(root))) != first
    (root / "c").rename(root / "a")
    (root / "empty").mkdir()
    assert data.digest(data.manifest(str(root))) != first


def test_one_file_is_its_own_manifest(tmp_path):
    path = tmp_path / "train.csv"
    path.write_bytes(b"x,y\n")
    assert data.manifest(str(path)) == [["train.csv", 4, hashlib.sha256(b"x,y\n").hexdigest()]]


def test_a_link_inside_the_data_is_refused_by_name(tmp_path):
    root = tree(tmp_path / "d", {"a": b"1"})
    (root / "l").symlink_to("/etc/passwd")
    with pytest.raises(data.DataError, match=r"/d/l is a link or a special file"):
        data.manifest(str(root))


def test_the_cache_reads_again_only_files_whose_size_or_mtime_changed(tmp_path, monkeypatch):
    root = tree(tmp_path / "d", {f"f{i}": bytes([i]) * 100 for i in range(5)})
    cache = tmp_path / "cache"
    first = data.cached_manifest(str(root), str(cache))
    assert first == {"digest": data.digest(data.manifest(str(root))), "files": 5, "bytes": 500}
    read = []
    real = data.file_sha256
    monkeypatch.setattr(data, "file_sha256", lambda p: read.append(os.path.basename(p)) or real(p))
    assert data.cached_manifest(str(root), str(cache)) == first
    assert read == []
    (root / "f3").write_bytes(b"changed")
    second = data.cached_manifest(str(root), str(cache))
    assert read == ["f3"] and second["digest"] != first["digest"] and second["bytes"] == 407
    # Another path's cache is its own.
    assert data.cache_name(str(root)) != data.cache_name(str(tmp_path))


def test_a_damaged_cache_is_read_as_empty(tmp_path):
    root = tree(tmp_path / "d", {"a": b"1"})
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / data.cache_name(str(root))).write_text("{not json")
    assert data.cached_manifest(str(root), str(cache))["files"] == 1


def v(name, time, inodes):
    return {"name": name, "time": time, "inodes": inodes}


def test_versions_above_the_limit_go_oldest_first():
    versions = [v("new", 3, {1: 100}), v("old", 1, {2: 100}), v("mid", 2, {3: 100})]
    assert data.to_remove(versions, 300, {"new"}) == []
    assert data.to_remove(versions, 250, {"new"}) == ["old"]
    assert data.to_remove(versions, 100, {"new"}) == ["old", "mid"]


def test_the_version_staged_and_those_in_use_stay_even_above_the_limit():
    versions = [v("new", 3, {1: 100}), v("old", 1, {2: 100}), v("mid", 2, {3: 100})]
    assert data.to_remove(versions, 0, {"new", "old"}) == ["mid"]
    assert data.to_remove(versions, 0, {"new", "old", "mid"}) == []


def test_hard_links_shared_between_versions_count_once():
    # Two versions that differ in one file: removing the older frees only that file.
    versions = [v("a", 1, {1: 1000, 2: 10}), v("b", 2, {1: 1000, 3: 10})]
    assert data.to_remove(versions, 1020, {"b"}) == []
    assert data.to_remove(versions, 1010, {"b"}) == ["a"]


def test_version_inodes_counts_a_hard_link_once(tmp_path):
    root = tree(tmp_path / "v", {"a": b"x" * 10})
    os.link(root / "a", root / "b")
    assert list(data.version_inodes(str(root)).values()) == [10]


def test_the_data_dirs_running_jobs_use_come_from_their_env_files():
    texts = [f"A=a\n{DATA_DIR}=/var/lib/torchrig/data/abc/\n", "A=b\n", f"X{DATA_DIR}=/nope\n"]
    assert data.data_dirs_in_use(texts, DATA_DIR) == {"/var/lib/torchrig/data/abc"}


def test_the_bytes_a_transfer_moved_come_from_rsyncs_stats():
    stats = "Number of files: 3\nTotal bytes sent: 1,048,911\nTotal bytes received: 35\n"
    assert data.rsync_bytes(stats, "sent") == 1048911
    assert data.rsync_bytes(stats, "received") == 35
    assert data.rsync_bytes("", "sent") == 0
