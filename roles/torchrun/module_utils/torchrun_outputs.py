"""What a job left in its run directory, listed on the node as the job's own user.

Plain functions, imported by the torchrun_outputs module and unit-tested in
tests/test_torchrun_fetch.py. The listing is taken before anything moves, so that the
fetch limits hold for what there is; links are listed apart and never followed.
"""

from __future__ import annotations

import os
import stat

# At most this many links and unreadable paths are named; the counts stay whole.
NAMED = 20
# The largest files are named when the fetch limits are passed.
LARGEST = 5


def list_outputs(run_dir: str, skip_dirs: list[str] | tuple[str, ...] = (),
                 skip_suffixes: list[str] | tuple[str, ...] = (".tmp",),
                 times_of: list[str] | tuple[str, ...] = ()) -> dict:
    """The regular files under run_dir: `names`, their paths relative to it, sorted, in one
    string with a NUL after each but the last (a NUL is the one byte no file name holds);
    `count`, `bytes` and the `largest` few as [path, size].

    One string, not a list of 10,000 small lists: Ansible takes a list that long apart
    and puts it together again in every task that touches it, some 0.5 s each here.
    A directory named in skip_dirs (at any depth) is left out with what it holds, as is a
    file ending in one of skip_suffixes. Links, sockets and devices are never followed nor
    listed as files: they are counted under `links` and `others`. A directory the reader
    cannot open is named under `unreadable`. `times`: the mtime of each file of times_of
    that is listed.
    """
    out: dict = {"exists": os.path.isdir(run_dir) and not os.path.islink(run_dir),
                 "names": "", "count": 0, "bytes": 0, "largest": [], "links": [], "links_count": 0,
                 "others_count": 0, "unreadable": [], "skipped_count": 0, "skipped_bytes": 0, "times": {}}
    if not out["exists"]:
        return out
    files: list[tuple[str, int]] = []
    root = run_dir.rstrip("/")
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel_dir) if rel_dir else root))
        except OSError:
            if len(out["unreadable"]) < NAMED:
                out["unreadable"].append(rel_dir)
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                out["links_count"] += 1
                if len(out["links"]) < NAMED:
                    out["links"].append(rel)
            elif stat.S_ISDIR(st.st_mode):
                if entry.name in skip_dirs:
                    out["skipped_count"] += 1
                else:
                    stack.append(rel)
            elif stat.S_ISREG(st.st_mode):
                if entry.name.endswith(tuple(skip_suffixes)):
                    out["skipped_count"] += 1
                    out["skipped_bytes"] += st.st_size
                else:
                    files.append((rel, st.st_size))
                    if rel in times_of:
                        out["times"][rel] = st.st_mtime
            else:
                out["others_count"] += 1
    files.sort()
    out.update(names="\0".join(rel for rel, _ in files), count=len(files), bytes=sum(size for _, size in files),
               largest=[[rel, size] for rel, size in sorted(files, key=lambda f: -f[1])[:LARGEST]])
    return out
