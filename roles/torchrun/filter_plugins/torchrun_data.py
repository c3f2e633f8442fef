"""What a data staging moved, from rsync's --stats (tasks/data.yml's report); the logic
is the collection's module_utils/torchrun_data.py."""

from __future__ import annotations

from ansible_collections.torchrig.cluster.plugins.module_utils import torchrun_data as data


def rsync_bytes(stats: str | None, which: str) -> int:
    return data.rsync_bytes(stats or "", which)


class FilterModule:
    def filters(self):
        return {"torchrun_rsync_bytes": rsync_bytes}
