#!/usr/bin/python
"""Ansible module: NVIDIA GPUs, driver, Secure Boot and free disk of a host."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: NVIDIA GPUs, installed driver, Secure Boot state and free disk of a host
description:
  - Asks C(nvidia-smi) for every GPU's name, PCI bus id, compute capability and the driver
    version. Where nvidia-smi is absent or fails (no driver yet), lists the GPUs with
    C(lspci -nn) and derives the compute capability from the chip's code name; without
    lspci (pciutils not installed yet) it reads the kernel's PCI list in sysfs and goes by
    the PCI device id.
  - Reads the Secure Boot state with C(mokutil --sb-state), or from the EFI variable
    when mokutil is absent, and whether a module signing key is enrolled.
  - Changes nothing.
options:
  disk_path:
    description: Path whose file system must have room (its closest existing parent is measured).
    type: path
    default: /opt
  signing_keys:
    description: DKMS module signing certificates; the first that exists is tested with C(mokutil --test-key).
    type: list
    elements: path
    default: []
author: torchrig
"""

EXAMPLES = r"""
- name: Gather GPU facts
  gpu_facts:
    disk_path: /opt/torchrig/venv
    signing_keys: [/var/lib/dkms/mok.pub]
  register: gpu
"""

RETURN = r"""
gpu:
  description: count, gpus (index, name, pci_bus_id, compute_capability, driver_version, memory_mib),
    compute_capabilities (sorted, unique), driver_version, source (nvidia-smi, lspci, sysfs, none) and notes.
  type: dict
  returned: always
secure_boot:
  description: enabled, signing_key (the first that exists, or null) and signing_key_enrolled.
  type: dict
  returned: always
disk:
  description: path measured and free_bytes.
  type: dict
  returned: always
"""

# Imports follow the documentation strings, as Ansible lays out its modules.
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.torchrig_gpu import (  # noqa: E402
    NVIDIA_SMI_ARGS,
    ParseError,
    nearest_existing,
    parse_driver_version,
    parse_lspci,
    parse_nvidia_smi,
    parse_sb_state,
    parse_secure_boot_efivar,
    parse_test_key,
)
from ansible.module_utils.torchrig_host import sysfs_pci_listing  # noqa: E402

SECURE_BOOT_EFIVAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
DRIVER_VERSION_FILES = ("/sys/module/nvidia/version", "/proc/driver/nvidia/version")
SYSFS_PCI = "/sys/bus/pci/devices"


def summary(gpus, driver, source, notes):
    ccs = sorted(
        {g["compute_capability"] for g in gpus if g["compute_capability"]}, key=lambda c: [int(x) for x in c.split(".")]
    )
    return {
        "count": len(gpus),
        "gpus": gpus,
        "compute_capabilities": ccs,
        "driver_version": driver,
        "source": source,
        "notes": notes,
    }


def gpu_facts(module):
    notes = []
    smi = module.get_bin_path("nvidia-smi")
    if smi:
        rc, out, err = module.run_command([smi] + NVIDIA_SMI_ARGS)
        if rc == 0:
            try:
                gpus = parse_nvidia_smi(out)
            except ParseError as e:
                module.fail_json(msg=f"gpu_facts: {e}")
            driver = gpus[0]["driver_version"] if gpus else None
            return summary(gpus, driver, "nvidia-smi", notes)
        # Installed but no driver loaded (e.g. before the reboot after an install).
        notes.append(f"nvidia-smi failed (rc {rc}): {(out + err).strip()[:300]}")

    driver = None
    for path in DRIVER_VERSION_FILES:
        if os.path.exists(path):
            with open(path) as f:
                driver = parse_driver_version(f.read())
            break

    lspci = module.get_bin_path("lspci")
    if lspci:
        rc, out, err = module.run_command([lspci, "-nn"])
        if rc != 0:
            module.fail_json(msg=f"gpu_facts: lspci -nn failed (rc {rc}): {err.strip()}")
        gpus = parse_lspci(out)
        return summary(gpus, driver, "lspci", notes)

    # lspci comes with pciutils, which the common role installs after preflight: the
    # kernel's own PCI list has the vendor, class and device ids that matter here.
    listing = sysfs_pci_listing(SYSFS_PCI)
    if listing:
        notes.append("lspci (package pciutils) is not installed: GPUs read from " + SYSFS_PCI)
        return summary(parse_lspci(listing), driver, "sysfs", notes)

    notes.append("neither a working nvidia-smi nor lspci (package pciutils) was found")
    return summary([], driver, "none", notes)


def secure_boot_facts(module, signing_keys):
    mokutil = module.get_bin_path("mokutil")
    enabled = False
    if mokutil:
        rc, out, err = module.run_command([mokutil, "--sb-state"])
        try:
            enabled = parse_sb_state(out + err)
        except ParseError as e:
            module.fail_json(msg=f"gpu_facts: {e}")
    elif os.path.exists(SECURE_BOOT_EFIVAR):
        with open(SECURE_BOOT_EFIVAR, "rb") as f:
            enabled = parse_secure_boot_efivar(f.read())

    key = next((k for k in signing_keys if os.path.exists(k)), None)
    enrolled = False
    if key and mokutil:
        rc, out, err = module.run_command([mokutil, "--test-key", key])
        enrolled = parse_test_key(out + err)
    return {"enabled": enabled, "signing_key": key, "signing_key_enrolled": enrolled}


def main():
    module = AnsibleModule(
        argument_spec={
            "disk_path": {"type": "path", "default": "/opt"},
            "signing_keys": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    measured = nearest_existing(module.params["disk_path"])
    st = os.statvfs(measured)
    module.exit_json(
        changed=False,
        gpu=gpu_facts(module),
        secure_boot=secure_boot_facts(module, module.params["signing_keys"]),
        disk={"path": measured, "free_bytes": st.f_bavail * st.f_frsize},
    )


if __name__ == "__main__":
    main()
