"""A job's data (train.yml's -e data=PATH): its manifest and digest, and which staged
versions a node removes. Plain functions, unit-tested in tests/test_torchrun_data.py; the
controller's lookup (roles/torchrun/lookup_plugins/torchrun_data_manifest.py) and the
node's module (roles/torchrun/library/torchrun_data.py) both use them, so the controller and every node compute one
digest the same way.

A version is addressed by its content: the digest is the sha256 of the manifest, one JSON
line per entry (relative name, size and sha256 of each file; each directory by name), in
name order. A node's copy whose manifest gives the same digest is the same data.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

CHUNK = 1 << 20
# Bump when the manifest's lines change: a cache of another format is read as empty.
CACHE_FORMAT = 1


class DataError(ValueError):
    """Data that cannot be staged, with the reason and what is expected."""


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def walk(root: str) -> list[tuple[str, os.stat_result]]:
    """Every entry under `root` (a directory, or one file) as (relative name, lstat), in
    name order; a directory's name ends with '/'. A link or a special file is refused:
    a link would point elsewhere on the nodes."""
    top = os.lstat(root)
    if stat.S_ISREG(top.st_mode):
        return [(os.path.basename(root), top)]
    if not stat.S_ISDIR(top.st_mode):
        raise DataError(f"{root} is neither a directory nor a regular file")
    out: list[tuple[str, os.stat_result]] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        for name in sorted(dirnames + filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISDIR(st.st_mode):
                out.append((rel + "/", st))
            elif stat.S_ISREG(st.st_mode):
                out.append((rel, st))
            else:
                raise DataError(f"{os.path.join(root, rel)} is a link or a special file; the data may "
                                "hold only directories and regular files (copy a link's target in)")
    return sorted(out, key=lambda e: e[0])


def _raise(e: OSError) -> None:
    raise DataError(f"cannot read {e.filename}: {e.strerror}")


def manifest(root: str, cache: Mapping[str, Sequence[Any]] | None = None) -> list[list[Any]]:
    """[name, size, sha256] per file, [name] per directory, in name order. `cache` maps a
    file's name to [size, mtime_ns, sha256] from an earlier call: a file of the same size
    and mtime is not read again."""
    return [e[:3] if len(e) == 4 else e for e in _manifest(root, cache or {})]


def _manifest(root: str, cache: Mapping[str, Sequence[Any]]) -> list[list[Any]]:
    """manifest() with each file's mtime_ns as a fourth field."""
    one_file = stat.S_ISREG(os.lstat(root).st_mode)
    entries: list[list[Any]] = []
    for rel, st in walk(root):
        if rel.endswith("/"):
            entries.append([rel])
            continue
        known = cache.get(rel)
        if known and known[0] == st.st_size and known[1] == st.st_mtime_ns:
            sha = known[2]
        else:
            path = root if one_file else os.path.join(root, rel)
            try:
                sha = file_sha256(path)
            except OSError as e:
                raise DataError(f"cannot read {path}: {e.strerror}") from None
        entries.append([rel, st.st_size, sha, st.st_mtime_ns])
    return entries


def digest(entries: Iterable[Sequence[Any]]) -> str:
    """The sha256 of the manifest's text, one JSON line per entry."""
    h = hashlib.sha256()
    for entry in entries:
        h.update(json.dumps(list(entry), separators=(",", ":")).encode() + b"\n")
    return h.hexdigest()


def summary(entries: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """The digest, the number of files and their bytes."""
    files = [e for e in entries if len(e) == 3]
    return {"digest": digest(entries), "files": len(files), "bytes": sum(int(e[1]) for e in files)}


def cache_name(root: str) -> str:
    """The cache file's name for a controller path."""
    return hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:32] + ".json"


def cached_manifest(root: str, cache_dir: str) -> dict[str, Any]:
    """summary() of `root`, reading again only the files whose size or mtime changed since
    the last call for the same path (the cache, one JSON file per path in `cache_dir`)."""
    path = os.path.join(cache_dir, cache_name(root))
    cache: dict[str, Any] = {}
    try:
        with open(path) as f:
            saved = json.load(f)
        if saved.get("format") == CACHE_FORMAT and saved.get("root") == os.path.abspath(root):
            cache = saved["files"]
    except (OSError, ValueError, KeyError, AttributeError):
        cache = {}
    entries = _manifest(root, cache)
    files = {e[0]: [e[1], e[3], e[2]] for e in entries if len(e) == 4}
    os.makedirs(cache_dir, mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"format": CACHE_FORMAT, "root": os.path.abspath(root), "files": files}, f)
    os.replace(tmp, path)
    return summary([e[:3] for e in entries])


# ------------------------------------------------------------------ on the node


def version_inodes(path: str) -> dict[tuple[int, int], int]:
    """(device, inode) -> size of each file under a staged version: versions share
    unchanged files as hard links, so their disk use is counted by inode."""
    out: dict[tuple[int, int], int] = {}
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                out[(st.st_dev, st.st_ino)] = st.st_size
    return out


def to_remove(versions: Sequence[Mapping[str, Any]], limit_bytes: int, keep: Iterable[str]) -> list[str]:
    """The versions to remove, oldest first, so that the disk the versions use together
    is at most `limit_bytes`; those in `keep` (the one being staged, those running jobs
    use) are never removed, even when they alone use more.

    versions: each {name, time (when it was staged), inodes ({inode: size})}.
    """
    keep = set(keep)
    alive = {v["name"]: v for v in versions}

    def used() -> int:
        sizes: dict[Any, int] = {}
        for v in alive.values():
            sizes.update(v["inodes"])
        return sum(sizes.values())

    removed: list[str] = []
    for v in sorted(versions, key=lambda v: (v["time"], v["name"])):
        if used() <= limit_bytes:
            break
        if v["name"] in keep:
            continue
        del alive[v["name"]]
        removed.append(v["name"])
    return removed


def data_dirs_in_use(env_texts: Iterable[str], env_name: str) -> set[str]:
    """The data directories that jobs' environment files name (`NAME=PATH` lines)."""
    out = set()
    for text in env_texts:
        for line in text.splitlines():
            if line.startswith(env_name + "="):
                out.add(line.split("=", 1)[1].strip().rstrip("/"))
    return out


def rsync_bytes(stats: str, which: str) -> int:
    """'Total bytes sent' or 'received' from rsync's --stats (0 when absent): what a
    transfer moved, protocol included."""
    m = re.search(rf"^Total bytes {which}: ([0-9,.]+)", stats or "", re.M)
    return int(re.sub(r"[,.]", "", m[1])) if m else 0
