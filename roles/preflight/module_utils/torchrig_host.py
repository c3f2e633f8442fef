"""Parsers for what a host says about its PCI devices, RDMA adapters and a pending reboot.

Pure functions over command output and file contents, unit-tested on recorded output
(tests/test_host_facts.py) and used by the host_facts and gpu_facts modules.
"""

from __future__ import annotations

import os
import re

# "18:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)"
_LSPCI_LINE = re.compile(
    r"^(?P<slot>\S+) (?P<cls_name>.+?) \[(?P<cls>[0-9a-f]{4})\]: (?P<desc>.+?) "
    r"\[(?P<vendor>[0-9a-f]{4}):(?P<device>[0-9a-f]{4})\](?: \(rev [0-9a-f]+\))?$"
)

# InfiniBand controllers are PCI class 0207 whoever makes them; RoCE adapters are
# Ethernet controllers (0200), so those count when Mellanox (now NVIDIA networking,
# vendor 15b3) made them: ConnectX and BlueField. Their other functions (bridges,
# DMA engines) are not network adapters.
INFINIBAND_CLASS = "0207"
NETWORK_CLASS_PREFIX = "02"
MELLANOX_VENDOR = "15b3"

# nvidia-smi's words when the loaded kernel module is older than the installed
# libraries: the driver was changed and the host has not rebooted since.
DRIVER_MISMATCH = "Driver/library version mismatch"
# nvidia-smi's words when no nvidia module is loaded at all (nouveau bound, or the
# module never built): after a first install, also a reboot away from working.
NO_DRIVER = "couldn't communicate with the NVIDIA driver"


def sysfs_pci_listing(root: str = "/sys/bus/pci/devices") -> str:
    """The kernel's own PCI device list, written as `lspci -nn` lines.

    Used when lspci (pciutils) is not installed yet: preflight runs before the common
    role installs it and must change nothing. sysfs has no device names, so each line
    says "Device", as an lspci whose pci.ids is too old to name the chip does.
    """
    if not os.path.isdir(root):
        return ""
    lines = []
    for slot in sorted(os.listdir(root)):
        fields = {}
        for name in ("class", "vendor", "device"):
            try:
                with open(os.path.join(root, slot, name)) as f:
                    fields[name] = f.read().strip().lower()
            except OSError:
                break
        if len(fields) != 3:
            continue
        # class is 0xCCSSPP (class, subclass, programming interface); lspci shows CCSS.
        cls = fields["class"].removeprefix("0x")[:4]
        vendor = fields["vendor"].removeprefix("0x")
        device = fields["device"].removeprefix("0x")
        lines.append(f"{slot} Class [{cls}]: Device [{vendor}:{device}]")
    return "\n".join(lines) + ("\n" if lines else "")


def parse_rdma_adapters(lspci_text: str) -> list[dict]:
    """InfiniBand and RoCE adapters from `lspci -nn` (or sysfs_pci_listing) output."""
    adapters = []
    for line in lspci_text.splitlines():
        m = _LSPCI_LINE.match(line.strip())
        if not m:
            continue
        cls, vendor = m.group("cls"), m.group("vendor")
        if cls == INFINIBAND_CLASS or (vendor == MELLANOX_VENDOR and cls.startswith(NETWORK_CLASS_PREFIX)):
            adapters.append(
                {
                    "pci_bus_id": m.group("slot"),
                    "name": m.group("desc"),
                    "pci_id": "{}:{}".format(vendor, m.group("device")),
                    "kind": "infiniband" if cls == INFINIBAND_CLASS else "ethernet (RoCE)",
                }
            )
    return adapters


def parse_reboot_required_pkgs(text: str | None) -> list[str]:
    """/var/run/reboot-required.pkgs: one package a line, repeats possible."""
    if not text:
        return []
    return sorted({line.strip() for line in text.splitlines() if line.strip()})


def reboot_state(gpu_notes: list[str], reboot_required: bool, reboot_pkgs: list[str]) -> dict:
    """Whether a reboot is pending, and whether it keeps CUDA from starting.

    gpu_notes are the gpu_facts module's notes (a failed nvidia-smi is recorded there).
    blocks_cuda: nvidia-smi says the loaded module does not match the installed driver,
    or a reboot is flagged and nvidia-smi cannot reach any driver: every CUDA program
    would fail until the host reboots, and later roles would report a misleading GPU
    count. Otherwise a flagged reboot (a kernel or library update) is only reported.
    """
    failed = [n for n in gpu_notes if n.startswith("nvidia-smi failed")]
    mismatch = [n for n in failed if DRIVER_MISMATCH in n]
    no_driver = [n for n in failed if NO_DRIVER in n]
    reasons = []
    if mismatch:
        reasons.append(
            f"nvidia-smi says \"{DRIVER_MISMATCH}\": the loaded nvidia kernel module is not the installed driver's"
        )
    if reboot_required:
        what = " (for {})".format(", ".join(reboot_pkgs)) if reboot_pkgs else ""
        reasons.append(f"/var/run/reboot-required is present{what}")
    blocks = bool(mismatch) or (reboot_required and bool(no_driver))
    if blocks and no_driver and not mismatch:
        reasons.append("nvidia-smi cannot reach the NVIDIA driver")
    return {"pending": bool(reasons), "blocks_cuda": blocks, "reasons": reasons}

