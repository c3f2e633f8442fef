#!/usr/bin/python
"""Ansible module: CPU architecture, a pending reboot and the RDMA adapters of a host."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_facts
short_description: CPU architecture, pending reboot and InfiniBand/RoCE adapters of a host
description:
  - Reads the CPU architecture, whether a reboot is pending (C(/var/run/reboot-required), or
    what nvidia-smi said to the gpu_facts module) and the host's InfiniBand and RoCE
    adapters (C(lspci -nn), else the kernel's PCI list in sysfs, and C(/sys/class/infiniband)).
  - Changes nothing.
options:
  gpu_notes:
    description: The gpu_facts module's notes (gpu.notes); a failed nvidia-smi is recorded there.
    type: list
    elements: str
    default: []
  reboot_required_file:
    description: The file Debian and Ubuntu packages create when they need a reboot.
    type: path
    default: /var/run/reboot-required
  pci_root:
    description: The kernel's PCI device list, read when lspci is not installed.
    type: path
    default: /sys/bus/pci/devices
  infiniband_root:
    description: Where the kernel lists RDMA devices (InfiniBand and RoCE alike).
    type: path
    default: /sys/class/infiniband
  python:
    description: The Python the pytorch role makes the venv with (its tasks use /usr/bin/python3); its
      major.minor decides which torch wheels pip can install.
    type: path
    default: /usr/bin/python3
author: torchrig
"""

EXAMPLES = r"""
- name: Gather host facts
  host_facts:
    gpu_notes: "{{ found.gpu.notes }}"
  register: host
"""

RETURN = r"""
architecture:
  description: The kernel's machine name (x86_64, aarch64).
  type: str
  returned: always
reboot:
  description: pending, blocks_cuda (a reboot is needed before CUDA can start) and reasons.
  type: dict
  returned: always
python:
  description: path and version (major.minor, null where it is missing or does not run) of the venv's Python.
  type: dict
  returned: always
rdma:
  description: present, adapters (pci_bus_id, name, pci_id, kind) and infiniband_devices
    (names in /sys/class/infiniband).
  type: dict
  returned: always
"""

# Imports follow the documentation strings, as Ansible lays out its modules.
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.torchrig_host import (  # noqa: E402
    parse_rdma_adapters,
    parse_reboot_required_pkgs,
    reboot_state,
    sysfs_pci_listing,
)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def main():
    module = AnsibleModule(
        argument_spec={
            "gpu_notes": {"type": "list", "elements": "str", "default": []},
            "reboot_required_file": {"type": "path", "default": "/var/run/reboot-required"},
            "pci_root": {"type": "path", "default": "/sys/bus/pci/devices"},
            "infiniband_root": {"type": "path", "default": "/sys/class/infiniband"},
            "python": {"type": "path", "default": "/usr/bin/python3"},
        },
        supports_check_mode=True,
    )
    p = module.params

    lspci = module.get_bin_path("lspci")
    if lspci:
        rc, out, err = module.run_command([lspci, "-nn"])
        if rc != 0:
            module.fail_json(msg=f"host_facts: lspci -nn failed (rc {rc}): {err.strip()}")
    else:
        out = sysfs_pci_listing(p["pci_root"])
    adapters = parse_rdma_adapters(out)
    ib_root = p["infiniband_root"]
    ib_devices = sorted(os.listdir(ib_root)) if os.path.isdir(ib_root) else []

    flagged = os.path.exists(p["reboot_required_file"])
    pkgs = parse_reboot_required_pkgs(read(p["reboot_required_file"] + ".pkgs")) if flagged else []

    python_version = None
    if os.access(p["python"], os.X_OK):
        rc, out, _err = module.run_command([p["python"], "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        python_version = out.strip() if rc == 0 and out.strip() else None

    module.exit_json(
        changed=False,
        python={"path": p["python"], "version": python_version},
        architecture=os.uname().machine,
        reboot=reboot_state(p["gpu_notes"], flagged, pkgs),
        rdma={"present": bool(adapters or ib_devices), "adapters": adapters, "infiniband_devices": ib_devices},
    )


if __name__ == "__main__":
    main()
