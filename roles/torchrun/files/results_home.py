#!/usr/bin/env python3
"""A run's results directory on the controller, made in one call before its files come.

The fetch (tasks/fetch.yml) keeps each run of a job in <fetch_dir>.runs/<run id>/ and
points <fetch_dir> at the newest. As stat, file and copy tasks on localhost that was
five module runs, each a fraction of a second, and a failure's report waited for them.

usage: results_home.py FETCH_DIR RUN_ID EARLIER_ID < {"journals": {node: [line, ...]}, "lists": {node: text}}

- FETCH_DIR as a directory (torchrig before runs had directories of their own) is
  moved to FETCH_DIR.runs/earlier-EARLIER_ID, kept whole;
- FETCH_DIR.runs, its RUN_ID, and RUN_ID/logs and RUN_ID/nodes are made 0700 (the
  results are the job's own, maybe private data: the controller user's alone, whatever
  the umask); FETCH_DIR becomes a link to FETCH_DIR.runs/RUN_ID;
- each node's journal is written to RUN_ID/logs/<node>.log, 0600, and each node's list
  of files to fetch, when given, to RUN_ID/logs/<node>.files (rsync's --files-from: one
  name a line, the names checked on the controller before they came here).

Prints {"changed": ..., "moved": ...}. The node names come from the inventory; a name
with a slash, or . or .., is refused.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path


def make_dir(path: Path) -> bool:
    """Make path (and its parents) 0700, or give it that mode; whether anything changed."""
    made = False
    if not path.is_dir():
        if not path.parent.is_dir():
            make_dir(path.parent)
        path.mkdir(mode=0o700)
        made = True
    if path.stat().st_mode & 0o777 != 0o700:
        path.chmod(0o700)
        made = True
    return made


def point(link: Path, target: str) -> bool:
    """link -> target (relative), replacing another link there; whether it changed."""
    if link.is_symlink() and os.readlink(link) == target:
        return False
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.symlink_to(target)
    os.replace(tmp, link)
    return True


def write(path: Path, text: str) -> bool:
    """path holds text, 0600; whether it changed."""
    data = text.encode()
    if path.is_file() and not path.is_symlink() and path.read_bytes() == data:
        if path.stat().st_mode & 0o777 != 0o600:
            path.chmod(0o600)
            return True
        return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)  # mkstemp made it 0600
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    fetch_dir, run_id, earlier_id = Path(argv[0]), argv[1], argv[2]
    given = json.load(sys.stdin)
    journals, lists = given["journals"], given.get("lists") or {}
    bad = [n for n in [*journals, *lists] if "/" in n or n in ("", ".", "..")]
    if bad:
        print(f"results_home: node names that are no file names: {bad}", file=sys.stderr)
        return 2
    runs = fetch_dir.with_name(fetch_dir.name + ".runs")
    results = runs / run_id
    changed = moved = False
    if fetch_dir.is_dir() and not fetch_dir.is_symlink():
        make_dir(runs)
        fetch_dir.rename(runs / f"earlier-{earlier_id}")
        changed = moved = True
    for path in (runs, results / "logs", results / "nodes"):
        changed |= make_dir(path)
    changed |= point(fetch_dir, f"{runs.name}/{run_id}")
    for node, lines in journals.items():
        changed |= write(results / "logs" / f"{node}.log", "".join(f"{line}\n" for line in lines))
    for node, names in lists.items():
        changed |= write(results / "logs" / f"{node}.files", f"{names}\n")
    print(json.dumps({"changed": changed, "moved": moved}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
