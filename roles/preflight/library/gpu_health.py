#!/usr/bin/python
"""Ansible module: the health of a node's NVIDIA GPUs, for playbooks/health.yml."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health
short_description: GPU count, ECC, persistence mode, fabric state, Xid errors and DCGM's quick diagnostic
description:
  - Runs C(nvidia-smi -q) and reads, per GPU, persistence mode, uncorrectable ECC counts,
    pending row remaps or page retirements and the NVSwitch fabric state.
  - Reads the kernel log since boot (C(journalctl -k -b 0), else C(dmesg)) for Xid errors.
  - Runs C(dcgmi diag -r LEVEL) where DCGM is installed.
  - Returns what it found and the problems, each naming the host. Changes nothing.
options:
  host:
    description: The host's inventory name, which every problem names.
    type: str
    required: true
  expected_gpus:
    description: GPUs preflight found on this host; nvidia-smi must see as many.
    type: int
    required: true
  xid_ignore:
    description: Xids reported but not counted as problems (caused by a user's program, not the GPU).
    type: list
    elements: int
    default: [13, 31, 43, 45]
  require_persistence:
    description: Count persistence mode off as a problem.
    type: bool
    default: true
  dcgm_level:
    description: Level of C(dcgmi diag -r) where dcgmi is installed (1 takes seconds, 2 minutes); 0 skips it.
    type: int
    default: 1
author: torchrig
"""

EXAMPLES = r"""
- name: Check the GPUs
  gpu_health:
    host: "{{ inventory_hostname }}"
    expected_gpus: 8
  register: health
"""

RETURN = r"""
nvidia_smi:
  description: driver_version, attached_gpus and gpus (index, pci_bus_id, name, persistence_mode, ecc_mode,
    ecc_uncorrectable_volatile, ecc_uncorrectable_aggregate, rows_remap_pending, rows_remap_failed,
    pages_retirement_pending, ecc_unrepairable_memory, ecc_channel_repair_pending, ecc_tpc_repair_pending,
    ecc_sram_threshold_exceeded (R580 and newer; null before), fabric_state, fabric_status); null when nvidia-smi
    failed.
  type: dict
  returned: always
xids:
  description: Xid lines of the kernel log since boot (pci_bus_id, xid, detail, line).
  type: list
  returned: always
dcgm:
  description: tests, failed and warned of dcgmi diag; null where DCGM is not installed or did not run.
  type: dict
  returned: always
problems:
  description: What is wrong, one line each, naming the host.
  type: list
  returned: always
"""

# Imports follow the documentation strings, as Ansible lays out its modules.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.torchrig_health import (  # noqa: E402
    health_problems,
    parse_dcgmi_diag,
    parse_nvidia_smi_q,
    parse_xids,
)


def kernel_log(module):
    """The kernel's messages since boot: the journal keeps them past the ring buffer's size."""
    journalctl = module.get_bin_path("journalctl")
    if journalctl:
        rc, out, _ = module.run_command([journalctl, "-k", "-b", "0", "-q", "--no-pager", "-o", "short-iso"])
        if rc == 0:
            return out
    dmesg = module.get_bin_path("dmesg")
    if dmesg:
        rc, out, _ = module.run_command([dmesg])
        if rc == 0:
            return out
    return ""


def main():
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "expected_gpus": {"type": "int", "required": True},
            "xid_ignore": {"type": "list", "elements": "int", "default": [13, 31, 43, 45]},
            "require_persistence": {"type": "bool", "default": True},
            "dcgm_level": {"type": "int", "default": 1, "choices": [0, 1, 2, 3, 4]},
        },
        supports_check_mode=True,
    )
    p = module.params
    host = p["host"]

    smi, smi_error = None, None
    nvidia_smi = module.get_bin_path("nvidia-smi")
    if not nvidia_smi:
        smi_error = "nvidia-smi is not installed"
    else:
        rc, out, err = module.run_command([nvidia_smi, "-q"])
        if rc != 0:
            smi_error = f"rc {rc}: {(out + err).strip()[:300]}"
        else:
            try:
                smi = parse_nvidia_smi_q(out)
            except ValueError as e:
                smi_error = str(e)

    xids = parse_xids(kernel_log(module))

    dcgm, dcgm_error = None, None
    dcgmi = module.get_bin_path("dcgmi")
    if dcgmi and p["dcgm_level"] > 0:
        rc, out, err = module.run_command([dcgmi, "diag", "-r", str(p["dcgm_level"])])
        dcgm = parse_dcgmi_diag(out)
        # dcgmi exits non-zero when a test fails too; no table at all means it did not run.
        if not dcgm["tests"]:
            dcgm, dcgm_error = None, f"rc {rc}: {(out + err).strip()[:300]}"

    module.exit_json(
        changed=False,
        nvidia_smi=smi,
        xids=xids,
        dcgm=dcgm,
        problems=health_problems(host, p["expected_gpus"], smi, smi_error, xids, p["xid_ignore"], dcgm,
                                 dcgm_error, p["require_persistence"]),
    )


if __name__ == "__main__":
    main()
