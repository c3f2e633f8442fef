"""What a data staging moved, from rsync's --stats (tasks/data.yml's report); the logic
is module_utils/torchrun_data.py's, loaded by path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "module_utils" / "torchrun_data.py"
_spec = importlib.util.spec_from_file_location("torchrun_data_utils", _PATH)
data = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(data)  # type: ignore[union-attr]


def rsync_bytes(stats: str | None, which: str) -> int:
    return data.rsync_bytes(stats or "", which)


class FilterModule:
    def filters(self):
        return {"torchrun_rsync_bytes": rsync_bytes}
