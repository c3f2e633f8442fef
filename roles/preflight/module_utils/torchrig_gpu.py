"""Parsers for what a host says about its NVIDIA GPUs, Secure Boot and disk.

Pure functions over command output, so they are unit-tested on recorded output
(tests/test_gpu_facts.py) and used by the gpu_facts module on the hosts.
"""

from __future__ import annotations

import os
import re

# The fields the gpu_facts module asks nvidia-smi for, in this order.
# compute_cap exists since driver 510; every driver the matrix allows is newer.
NVIDIA_SMI_FIELDS = ("index", "name", "pci.bus_id", "compute_cap", "driver_version", "memory.total")
NVIDIA_SMI_ARGS = [
    "--query-gpu=" + ",".join(NVIDIA_SMI_FIELDS),
    "--format=csv,noheader,nounits",
]

# PCI classes of a GPU: 0300 VGA controller (GeForce, workstation cards),
# 0302 3D controller (data-centre cards without display outputs). An RTX card's
# audio (0403) and USB-C (0c03) functions share the vendor id and are not GPUs.
GPU_PCI_CLASSES = ("0300", "0302")
NVIDIA_VENDOR = "10de"

# Compute capability by the chip's code name, which lspci prints before the
# marketing name ("GH100 [H100 PCIe]"). Used only when nvidia-smi cannot say,
# i.e. before a driver is installed. First match wins.
CODENAME_CC = (
    (r"^GK210", "3.7"),  # K80
    (r"^GK110", "3.5"),  # K20, K40 (GK110GL, GK110BGL)
    (r"^GK", "3.0"),
    (r"^GM10", "5.0"),
    (r"^GM20", "5.2"),
    (r"^GP100", "6.0"),
    (r"^GP10", "6.1"),
    (r"^GV100", "7.0"),
    (r"^TU1", "7.5"),
    (r"^GA100", "8.0"),
    (r"^GA10", "8.6"),
    (r"^AD10", "8.9"),
    (r"^GH100", "9.0"),
    (r"^GB10[0-2]", "10.0"),
    (r"^GB20", "12.0"),
)

# Compute capability by PCI device id, for lspci builds whose pci.ids is too
# old to name the chip ("NVIDIA Corporation Device [10de:2330]"). The common
# data-centre and workstation parts; others fall back to the code name.
DEVICE_ID_CC = {
    "2330": "9.0",  # H100 SXM5 80GB
    "2331": "9.0",  # H100 PCIe
    "2335": "9.0",  # H200 SXM 141GB
    "20b0": "8.0",  # A100 SXM4 40GB
    "20b2": "8.0",  # A100 SXM4 80GB
    "20b5": "8.0",  # A100 PCIe 80GB
    "20f1": "8.0",  # A100 PCIe 40GB
    "26b9": "8.9",  # L40S
    "27b8": "8.9",  # L4
    "2684": "8.9",  # GeForce RTX 4090
    "1db1": "7.0",  # V100 SXM2 16GB
    "1db4": "7.0",  # V100 PCIe 16GB
    "1eb8": "7.5",  # T4
    "15f7": "6.0",  # P100 PCIe 12GB
    "15f8": "6.0",  # P100 PCIe 16GB
    "2901": "10.0",  # B200
}

# "17:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 PCIe] [10de:2331] (rev a1)"
_LSPCI_LINE = re.compile(
    r"^(?P<slot>\S+) (?P<cls_name>.+?) \[(?P<cls>[0-9a-f]{4})\]: (?P<desc>.+?) "
    r"\[(?P<vendor>[0-9a-f]{4}):(?P<device>[0-9a-f]{4})\](?: \(rev [0-9a-f]+\))?$"
)


class ParseError(ValueError):
    """Output that does not look like what the parser expects."""


def parse_nvidia_smi(text):
    """GPUs from `nvidia-smi --query-gpu=<NVIDIA_SMI_FIELDS> --format=csv,noheader,nounits`."""
    gpus = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(NVIDIA_SMI_FIELDS):
            raise ParseError(f"unexpected nvidia-smi line (want {len(NVIDIA_SMI_FIELDS)} fields): {line!r}")
        index, name, bus_id, cc, driver, memory = fields
        if not re.match(r"^\d+\.\d+$", cc):
            raise ParseError(f"unexpected compute capability {cc!r} in nvidia-smi line {line!r}")
        gpus.append(
            {
                "index": int(index),
                "name": name,
                "pci_bus_id": bus_id,
                "compute_capability": cc,
                "driver_version": driver,
                "memory_mib": int(memory) if memory.isdigit() else None,
            }
        )
    return gpus


def compute_capability_from_codename(desc):
    """'GA100 [A100 SXM4 40GB]' -> '8.0'; None for a chip this table does not know."""
    for pattern, cc in CODENAME_CC:
        if re.match(pattern, desc):
            return cc
    return None


def parse_lspci(text):
    """NVIDIA GPUs from `lspci -nn` (display and 3D controllers only)."""
    gpus = []
    for line in text.splitlines():
        m = _LSPCI_LINE.match(line.strip())
        if not m or m.group("vendor") != NVIDIA_VENDOR or m.group("cls") not in GPU_PCI_CLASSES:
            continue
        desc = m.group("desc")
        if desc.startswith("NVIDIA Corporation "):
            desc = desc[len("NVIDIA Corporation ") :]
        # The marketing name is in the last brackets: "GH100 [H100 PCIe]".
        marketing = re.search(r"\[([^\]]+)\]\s*$", desc)
        gpus.append(
            {
                "index": len(gpus),
                "name": marketing.group(1) if marketing else desc,
                "pci_bus_id": m.group("slot"),
                "pci_device_id": "{}:{}".format(m.group("vendor"), m.group("device")),
                "compute_capability": compute_capability_from_codename(desc) or DEVICE_ID_CC.get(m.group("device")),
                "driver_version": None,
                "memory_mib": None,
            }
        )
    return gpus


def parse_sb_state(text):
    """`mokutil --sb-state` (stdout and stderr) -> True (on), False (off, no EFI, or an
    EFI firmware without the SecureBoot variable: "This system doesn't support Secure
    Boot", exit status 255, so nothing checks module signatures)."""
    if re.search(r"SecureBoot enabled", text):
        return True
    if re.search(
        r"SecureBoot disabled|not supported|EFI variables are not supported|doesn't support Secure Boot", text
    ):
        return False
    raise ParseError(f"unexpected mokutil --sb-state output: {text.strip()!r}")


def parse_secure_boot_efivar(data):
    """The SecureBoot EFI variable: 4 attribute bytes, then 1 value byte (1 = on)."""
    if len(data) < 5:
        raise ParseError(f"SecureBoot EFI variable is {len(data)} bytes, expected 5")
    return bytearray(data)[4] == 1


def parse_test_key(text):
    """`mokutil --test-key KEY` -> True when the key is enrolled."""
    return "is already enrolled" in text


def parse_driver_version(text):
    """/sys/module/nvidia/version or /proc/driver/nvidia/version -> '580.95.05'."""
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def nearest_existing(path):
    """The path itself or its closest existing parent (the venv may not exist yet)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path
