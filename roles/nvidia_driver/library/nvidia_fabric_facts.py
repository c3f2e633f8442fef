#!/usr/bin/python
"""Ansible module: the NVSwitch fabric state of every GPU, from nvidia-smi -q."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_fabric_facts
short_description: Fabric state and status of every GPU (C(nvidia-smi -q))
description:
  - On NVSwitch boards a GPU can run CUDA only once Fabric Manager has registered it with the
    fabric; C(nvidia-smi -q) then shows State Completed and Status Success in its Fabric section.
  - Changes nothing.
options: {}
author: torchrig
"""

RETURN = r"""
gpus:
  description: gpu (PCI bus id), state, status per GPU.
  type: list
  returned: always
ready:
  description: Every GPU is Completed with Success.
  type: bool
  returned: always
problems:
  description: One line per GPU that is not ready.
  type: list
  returned: always
"""

# Imports follow the documentation strings, as Ansible lays out its modules.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.torchrig.cluster.plugins.module_utils.torchrig_driver import (  # noqa: E402
    PlanError,
    fabric_problems,
    parse_fabric,
)


def main():
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    smi = module.get_bin_path("nvidia-smi")
    if not smi:
        module.exit_json(changed=False, gpus=[], ready=False, problems=["nvidia-smi is not installed"])
    rc, out, err = module.run_command([smi, "-q"], environ_update={"LC_ALL": "C"})
    if rc != 0:
        problem = f"nvidia-smi -q failed (rc {rc}): {(out + err).strip()[:300]}"
        module.exit_json(changed=False, gpus=[], ready=False, problems=[problem])
    try:
        gpus = parse_fabric(out)
    except PlanError as e:
        module.exit_json(changed=False, gpus=[], ready=False, problems=[str(e)])
    problems = fabric_problems(gpus)
    module.exit_json(changed=False, gpus=gpus, ready=not problems, problems=problems)


if __name__ == "__main__":
    main()
