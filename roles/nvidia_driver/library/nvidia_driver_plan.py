#!/usr/bin/python
"""Ansible module: decide the NVIDIA driver branch, kernel modules and fabric packages of a host."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver_plan
short_description: Decide which NVIDIA driver packages a GPU host gets, before anything changes
description:
  - Chooses the driver branch by policy (never below the stack's minimum driver, never a
    downgrade of a newer driver that meets it), the kernel module flavour by GPU generation,
    and, on NVSwitch boards (NVIDIA PCI class 0680 in C(lspci -nn)), Fabric Manager at the
    driver's version (plus nvlsm and NVSDM on Blackwell).
  - On Blackwell NVLink 5 boards (no NVSwitch on the PCI bus; ConnectX bridges with SW_MNG in
    their VPD under C(pci_root)) Fabric Manager, nvlsm and infiniband-diags, and mlx5_core and ib_umad.
  - The kernel headers meta package for the running kernel's flavour (C(kernel_headers_meta) auto).
  - Reads the installed packages with C(dpkg-query). Changes nothing.
options:
  catalogue: {description: The matrix's driver_branches., type: list, elements: dict, required: true}
  policy: {description: supported, long_term or stack., type: str, required: true}
  min_version: {description: The stack's minimum driver (the floor)., type: str, required: true}
  host_compute_capabilities: {description: This host's GPUs., type: list, elements: str, default: []}
  cluster_compute_capabilities: {description: Every GPU of the cluster., type: list, elements: str, default: []}
  gpu_names:
    {description: This host's GPU names (Grace Hopper is told by name)., type: list, elements: str, default: []}
  distribution: {description: Debian or Ubuntu., type: str, required: true}
  packages_by_os:
    description: Driver package names per distribution and flavour ({branch} is replaced).
    type: dict
    required: true
  kernel_modules: {description: auto, open or proprietary., type: str, default: auto}
  fabricmanager: {description: auto (NVSwitch found), always or never., type: str, default: auto}
  nvlsm: {description: auto (Fabric Manager and Blackwell), always or never., type: str, default: auto}
  branch_max: {description: Highest branch allowed; empty for any., type: str, default: ""}
  branch: {description: A branch named by the user instead of the policy., type: str, default: ""}
  version: {description: A package version on that branch., type: str, default: ""}
  stack_branch: {description: The matrix row's driver branch (policy stack)., type: str, default: ""}
  stack_version: {description: The matrix row's driver version (policy stack)., type: str, default: ""}
  downgrade: {description: Allow replacing a newer installed driver., type: bool, default: false}
  update: {description: Bring the driver to the newest point release of its branch., type: bool, default: false}
  pci_root:
    description: Where the PCI functions are listed (sysfs); the NVLink 5 bridges are read from it.
    type: path
    default: /sys/bus/pci/devices
  kernel_headers_meta:
    description: auto (derived from the running kernel), empty (none) or a package name.
    type: str
    default: auto
  kernel_release: {description: The running kernel (uname -r)., type: str, default: ""}
  distribution_version: {description: The OS release (Ubuntu 22.04 tells its HWE kernel)., type: str, default: ""}
  lspci_output_file:
    description: Read this recorded C(lspci -nn) output instead of running lspci (tests).
    type: path
    default: ""
author: torchrig
"""

RETURN = r"""
plan:
  description: branch, version, upstream, pin, why, kept, kernel_modules, nvswitches, nvlink5_bridges,
    fabricmanager, nvlsm, fabric_kernel_modules, driver_packages, pinning_packages, fabric_packages,
    versioned_packages, other_packages, hold, stale_packages, change, module_change, to_change, installed,
    kernel_headers_meta.
  type: dict
  returned: always
"""

# Imports follow the documentation strings, as Ansible lays out its modules.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.torchrig.cluster.plugins.module_utils.torchrig_driver import (  # noqa: E402
    PlanError,
    kernel_headers_meta,
    plan,
    read_pci_devices,
)


def read_lspci(module):
    path = module.params["lspci_output_file"]
    if path:
        try:
            with open(path) as f:
                return f.read()
        except OSError as e:
            module.fail_json(msg=f"nvidia_driver_plan: cannot read lspci_output_file {path}: {e}")
    lspci = module.get_bin_path("lspci")
    if not lspci:
        module.fail_json(msg="nvidia_driver_plan: lspci is missing (package pciutils); it tells NVSwitch boards apart")
    rc, out, err = module.run_command([lspci, "-nn"])
    if rc != 0:
        module.fail_json(msg=f"nvidia_driver_plan: lspci -nn failed (rc {rc}): {err.strip()}")
    return out


def read_installed(module):
    rc, out, err = module.run_command(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}\t${Package}\t${Version}\n"])
    if rc not in (0, 1):
        module.fail_json(msg=f"nvidia_driver_plan: dpkg-query failed (rc {rc}): {err.strip()}")
    installed = {}
    for line in out.splitlines():
        parts = line.split("\t")
        # "ii " installed; "hi " held and installed.
        if len(parts) == 3 and parts[0][1:2] == "i":
            installed[parts[1]] = parts[2]
    return installed


def main():
    module = AnsibleModule(
        argument_spec={
            "catalogue": {"type": "list", "elements": "dict", "required": True},
            "policy": {"type": "str", "required": True},
            "min_version": {"type": "str", "required": True},
            "host_compute_capabilities": {"type": "list", "elements": "str", "default": []},
            "cluster_compute_capabilities": {"type": "list", "elements": "str", "default": []},
            "gpu_names": {"type": "list", "elements": "str", "default": []},
            "distribution": {"type": "str", "required": True},
            "packages_by_os": {"type": "dict", "required": True},
            "kernel_modules": {"type": "str", "default": "auto"},
            "fabricmanager": {"type": "str", "default": "auto"},
            "nvlsm": {"type": "str", "default": "auto"},
            "branch_max": {"type": "str", "default": ""},
            "branch": {"type": "str", "default": ""},
            "version": {"type": "str", "default": ""},
            "stack_branch": {"type": "str", "default": ""},
            "stack_version": {"type": "str", "default": ""},
            "downgrade": {"type": "bool", "default": False},
            "lspci_output_file": {"type": "path", "default": ""},
            "update": {"type": "bool", "default": False},
            "pci_root": {"type": "path", "default": "/sys/bus/pci/devices"},
            "kernel_headers_meta": {"type": "str", "default": "auto"},
            "kernel_release": {"type": "str", "default": ""},
            "distribution_version": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = plan(
            catalogue=p["catalogue"],
            policy=p["policy"],
            floor=p["min_version"],
            host_ccs=p["host_compute_capabilities"],
            cluster_ccs=p["cluster_compute_capabilities"],
            gpu_names=p["gpu_names"],
            distribution=p["distribution"],
            packages_by_os=p["packages_by_os"],
            installed=read_installed(module),
            lspci=read_lspci(module),
            pci_devices=read_pci_devices(p["pci_root"]),
            kernel_modules_override=p["kernel_modules"],
            fabricmanager=p["fabricmanager"],
            nvlsm=p["nvlsm"],
            branch_max=p["branch_max"],
            branch=p["branch"],
            version=p["version"],
            stack={"branch": p["stack_branch"], "version": p["stack_version"]},
            downgrade=p["downgrade"],
            update=p["update"],
        )
        meta = p["kernel_headers_meta"]
        if meta == "auto":
            meta = kernel_headers_meta(p["distribution"], p["distribution_version"], p["kernel_release"])
        result["kernel_headers_meta"] = meta
    except PlanError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, plan=result)


if __name__ == "__main__":
    main()
