#!/usr/bin/python
"""Ansible module: which kernel modules a GPU host loads at every boot (nvidia-uvm, nvidia-peermem, NVLink 5's)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver_modules
short_description: Decide the kernel modules a GPU host loads at every boot
description:
  - nvidia-uvm always. nvidia-peermem by C(peermem) (never, auto, always); auto loads it only with an
    InfiniBand HCA (not an Ethernet ConnectX, not an NVLink 5 switch bridge), the kernel's peer-memory
    API (C(peer_memory_dir), from MLNX_OFED/DOCA-OFED) and no DMA-BUF (open kernel modules on Linux 5.12+).
  - mlx5_core and ib_umad on Blackwell NVLink 5 boards (ConnectX bridges with SW_MNG in their VPD), which
    Fabric Manager and nvlsm need.
  - Changes nothing.
options:
  peermem: {description: never, auto or always (true/false accepted)., type: str, default: never}
  rdma_adapters: {description: preflight_rdma.adapters (pci_bus_id, kind)., type: list, elements: dict, default: []}
  pci_root: {description: Where the PCI functions are listed (sysfs)., type: path, default: /sys/bus/pci/devices}
  peer_memory_dir:
    {description: Present when the kernel has the peer-memory API., type: path, default: /sys/kernel/mm/memory_peers}
  driver_version_file:
    description: The loaded driver's /proc file; "Open Kernel Module" there means the open modules.
    type: path
    default: /proc/driver/nvidia/version
  kernel_modules: {description: "The flavour: open, proprietary; empty reads the loaded one.", type: str, default: ""}
author: torchrig
"""

RETURN = r"""
modules: {description: Module names for modules-load.d, in load order., type: list, returned: always}
peermem: {description: Whether nvidia-peermem is loaded., type: bool, returned: always}
peermem_why: {description: Why or why not., type: str, returned: always}
nvlink5_bridges: {description: The NVLink 5 switch bridges found., type: list, returned: always}
"""

import os  # noqa: E402

# Imports follow the documentation strings, as Ansible lays out its modules.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.torchrig.cluster.plugins.module_utils.torchrig_driver import (  # noqa: E402
    NVLINK5_KERNEL_MODULES,
    PlanError,
    nvlink5_bridges,
    peermem,
    read_pci_devices,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "peermem": {"type": "str", "default": "never"},
            "rdma_adapters": {"type": "list", "elements": "dict", "default": []},
            "pci_root": {"type": "path", "default": "/sys/bus/pci/devices"},
            "peer_memory_dir": {"type": "path", "default": "/sys/kernel/mm/memory_peers"},
            "driver_version_file": {"type": "path", "default": "/proc/driver/nvidia/version"},
            "kernel_modules": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    flavor = p["kernel_modules"]
    if not flavor:
        try:
            with open(p["driver_version_file"]) as f:
                flavor = "open" if "Open Kernel Module" in f.read() else "proprietary"
        except OSError:
            flavor = ""
    bridges = nvlink5_bridges(read_pci_devices(p["pci_root"]))
    try:
        load, why = peermem(
            p["peermem"],
            p["rdma_adapters"],
            bridges,
            os.path.isdir(p["peer_memory_dir"]),
            flavor,
            os.uname().release,
        )
    except PlanError as e:
        module.fail_json(msg=str(e))
    modules = ["nvidia-uvm"] + (["nvidia-peermem"] if load else []) + (list(NVLINK5_KERNEL_MODULES) if bridges else [])
    module.exit_json(changed=False, modules=modules, peermem=load, peermem_why=why, nvlink5_bridges=bridges)


if __name__ == "__main__":
    main()
