"""The metrics records (contract.FILES["metrics"]): read line by line, rewritten atomically.

A full disk or a power loss can leave the last line cut short. The checkpoints
are still good, so a resume must not fail on it: a line that is not a whole
record is skipped and reported, and the rest is read as usual.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

log = logging.getLogger("torchrig")

# What every record has (Outputs.record writes them); a line without them is not one.
REQUIRED = ("split", "step")


def read_records(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The records of `path` in order, and a note for each line that was skipped.

    A missing file has none. Each line is decoded on its own, so one broken line
    (most often the last, cut short) costs that line only.
    """
    records: list[dict[str, Any]] = []
    skipped: list[str] = []
    if not path.exists():
        return records, skipped
    with path.open("rb") as f:
        lines = f.read().split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            rec = None
        if not isinstance(rec, dict) or any(k not in rec for k in REQUIRED):
            where = "last line" if number - 1 == last else "line"
            skipped.append(f"{path}: {where} {number} is not a whole record ({len(raw)} bytes: "
                           f"{raw[:60]!r}); skipped")
            continue
        records.append(rec)
    for note in skipped:
        log.warning("%s", note)
    return records, skipped


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text`: a reader (or a power loss) sees the old file or the new one.

    The temp file sits beside it (a rename is atomic within one file system), is
    fsynced before the rename, and the directory after it, so the rename is kept too.
    """
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
