"""The gpu_facts module's parsers on recorded nvidia-smi and lspci output."""

import pytest
from rolepy import fixture_text, gpu_mod


@pytest.fixture(scope="module")
def gpu():
    return gpu_mod


SMI = [
    # fixture, count, name, compute capability, driver
    ("h100-8x.nvidia-smi", 8, "NVIDIA H100 80GB HBM3", "9.0", "580.95.05"),
    # Captured on a real H200 (2026-12-04), the others transcribed (fixtures/gpu/README.md).
    ("h200.nvidia-smi", 1, "NVIDIA H200", "9.0", "580.159.04"),
    ("a100-4x.nvidia-smi", 4, "NVIDIA A100-SXM4-40GB", "8.0", "570.172.08"),
    ("v100.nvidia-smi", 1, "Tesla V100-SXM2-16GB", "7.0", "535.230.02"),
    ("t4.nvidia-smi", 1, "Tesla T4", "7.5", "550.163.01"),
    ("rtx4090.nvidia-smi", 1, "NVIDIA GeForce RTX 4090", "8.9", "560.35.03"),
    ("p100.nvidia-smi", 1, "Tesla P100-PCIE-16GB", "6.0", "535.230.02"),
]


@pytest.mark.parametrize("fixture,count,name,cc,driver", SMI)
def test_nvidia_smi(gpu, fixture, count, name, cc, driver):
    gpus = gpu.parse_nvidia_smi(fixture_text(fixture))
    assert len(gpus) == count
    assert [g["index"] for g in gpus] == list(range(count))
    assert {g["name"] for g in gpus} == {name}
    assert {g["compute_capability"] for g in gpus} == {cc}
    assert {g["driver_version"] for g in gpus} == {driver}
    assert all(g["memory_mib"] > 10000 for g in gpus)


def test_nvidia_smi_bus_ids(gpu):
    gpus = gpu.parse_nvidia_smi(fixture_text("h100-8x.nvidia-smi"))
    assert gpus[0]["pci_bus_id"] == "00000000:18:00.0"
    assert gpus[7]["pci_bus_id"] == "00000000:DB:00.0"


def test_nvidia_smi_rejects_other_output(gpu):
    # What nvidia-smi prints without a loaded driver must not read as zero GPUs.
    failed = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    with pytest.raises(gpu.ParseError):
        gpu.parse_nvidia_smi(failed)
    # A driver too old for the compute_cap field.
    with pytest.raises(gpu.ParseError):
        gpu.parse_nvidia_smi("0, Tesla K80, 00000000:00:1E.0, [Not Supported], 470.82.01, 11441")


def test_nvidia_smi_empty_is_no_gpu(gpu):
    assert gpu.parse_nvidia_smi("\n") == []


LSPCI = [
    # fixture, names, compute capabilities, bus ids
    ("h100.lspci", ["H100 SXM5 80GB"] * 2, ["9.0", "9.0"], ["18:00.0", "2a:00.0"]),
    ("a100.lspci", ["A100 SXM4 40GB"] * 2, ["8.0", "8.0"], ["07:00.0", "0f:00.0"]),
    ("v100.lspci", ["Tesla V100 SXM2 16GB"], ["7.0"], ["00:1e.0"]),
    ("t4.lspci", ["Tesla T4"], ["7.5"], ["00:1e.0"]),
    ("rtx4090.lspci", ["GeForce RTX 4090"], ["8.9"], ["01:00.0"]),
    ("p100.lspci", ["Tesla P100 PCIe 16GB"], ["6.0"], ["00:04.0"]),
    # An old pci.ids names no chip: the device id still tells.
    ("h100-old-pciids.lspci", ["Device", "GH100"], ["9.0", "9.0"], ["0000:17:00.0", "0000:65:00.0"]),
    ("no-gpu.lspci", [], [], []),
]


@pytest.mark.parametrize("fixture,names,ccs,slots", LSPCI)
def test_lspci(gpu, fixture, names, ccs, slots):
    gpus = gpu.parse_lspci(fixture_text(fixture))
    assert [g["name"] for g in gpus] == names
    assert [g["compute_capability"] for g in gpus] == ccs
    assert [g["pci_bus_id"] for g in gpus] == slots
    assert all(g["driver_version"] is None for g in gpus)


def test_lspci_skips_nvswitch_audio_and_other_vendors(gpu):
    # NVSwitch bridges (0680) and the RTX card's audio function (0403) carry
    # NVIDIA's vendor id but are not GPUs; the host's Intel VGA is not NVIDIA.
    assert len(gpu.parse_lspci(fixture_text("h100.lspci"))) == 2
    assert [g["pci_device_id"] for g in gpu.parse_lspci(fixture_text("rtx4090.lspci"))] == ["10de:2684"]


@pytest.mark.parametrize(
    "desc,cc",
    [
        ("GK210GL [Tesla K80]", "3.7"),
        # GK110 is compute capability 3.5 (K20, K40), not the K80's 3.7.
        ("GK110GL [Tesla K20Xm]", "3.5"),
        ("GK110BGL [Tesla K40m]", "3.5"),
        ("GM204GL [Tesla M60]", "5.2"),
        ("GP104 [GeForce GTX 1080]", "6.1"),
        ("GA102 [GeForce RTX 3090]", "8.6"),
        ("AD104GL [L4]", "8.9"),
        ("GB202 [GeForce RTX 5090]", "12.0"),
        ("Device", None),
    ],
)
def test_codename(gpu, desc, cc):
    assert gpu.compute_capability_from_codename(desc) == cc


def test_secure_boot(gpu):
    assert gpu.parse_sb_state("SecureBoot enabled\n") is True
    assert gpu.parse_sb_state("SecureBoot disabled\nPlatform is in Setup Mode\n") is False
    assert gpu.parse_sb_state("EFI variables are not supported on this system\n") is False
    with pytest.raises(gpu.ParseError):
        gpu.parse_sb_state("mokutil: command failed\n")
    assert gpu.parse_secure_boot_efivar(b"\x06\x00\x00\x00\x01") is True
    assert gpu.parse_secure_boot_efivar(b"\x06\x00\x00\x00\x00") is False
    with pytest.raises(gpu.ParseError):
        gpu.parse_secure_boot_efivar(b"\x06")


# `mokutil --sb-state` as the gpu_facts module reads it: stdout and stderr joined.
SB_STATE = [
    ("SecureBoot enabled\n", True),
    ("SecureBoot disabled\n", False),
    ("SecureBoot disabled\nPlatform is in Setup Mode\n", False),
    # Legacy BIOS boot: no EFI variables at all.
    ("EFI variables are not supported on this system\n", False),
    # An EFI machine without the SecureBoot variable (many cloud VMs, firmware
    # without Secure Boot): mokutil prints this on stderr and exits 255.
    ("This system doesn't support Secure Boot\n", False),
]


@pytest.mark.parametrize("text,enabled", SB_STATE)
def test_sb_state_recorded_outputs(gpu, text, enabled):
    assert gpu.parse_sb_state(text) is enabled


def test_sb_state_unknown_output_is_named(gpu):
    with pytest.raises(gpu.ParseError, match=r"unexpected mokutil --sb-state output: 'Failed to read SecureBoot'"):
        gpu.parse_sb_state("Failed to read SecureBoot\n")


def test_test_key(gpu):
    assert gpu.parse_test_key("/var/lib/dkms/mok.pub is already enrolled\n")
    assert not gpu.parse_test_key("/var/lib/dkms/mok.pub is not enrolled\n")


def test_driver_version_files(gpu):
    assert gpu.parse_driver_version("580.95.05\n") == "580.95.05"
    proc = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.172.08  Release Build  (dvs-builder@U16)"
    assert gpu.parse_driver_version(proc.split("Module for x86_64")[1]) == "570.172.08"


def test_nearest_existing(gpu, tmp_path):
    assert gpu.nearest_existing(str(tmp_path / "a" / "b")) == str(tmp_path)
    assert gpu.nearest_existing(str(tmp_path)) == str(tmp_path)


def test_driver_version_from_a_real_h200(gpu):
    # /proc/driver/nvidia/version as the H200's open kernel module wrote it.
    text = fixture_text("h200.proc-driver-version")
    assert gpu.parse_driver_version(text) == "580.159.04"
    assert "Open Kernel Module" in text
