"""The text of the nodes' GPU runner: the collection's module_utils/torchrun_gpus.py, the one
copy of the GPU logic. tasks/main.yml installs it on each node, where a GPU job's unit runs it
as it starts (its claim of its GPUs) and the GPU queue's timer runs it (tasks/queue.yml)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: torchrun_gpus_runner
short_description: The source of torchrig's GPU runner, to install on the nodes
description:
  - Returns one string, the text of the torchrig.cluster collection's module_utils/torchrun_gpus.py.
    Takes no terms.
"""

RETURN = r"""
_raw: {description: The file's text., type: list, elements: str}
"""

from pathlib import Path  # noqa: E402

from ansible.plugins.lookup import LookupBase  # noqa: E402
from ansible_collections.torchrig.cluster.plugins.module_utils import torchrun_gpus  # noqa: E402


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [Path(torchrun_gpus.__file__).read_text(encoding="utf-8")]
