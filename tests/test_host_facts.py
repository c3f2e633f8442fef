"""The host_facts module's parsers and preflight's architecture check, on recorded output."""

from pathlib import Path

import pytest
from rolepy import fixture_text, gpu_mod, load

host_mod = load("roles/preflight/module_utils/torchrig_host.py", "torchrig_host")
arch_mod = load("roles/preflight/filter_plugins/torchrig_arch.py", "torchrig_arch")


def test_rdma_adapters_infiniband_and_bluefield():
    found = host_mod.parse_rdma_adapters(fixture_text("hgx-ib.lspci"))
    # The two ConnectX-7 in InfiniBand mode and BlueField-3's Ethernet function (RoCE);
    # not its PCI bridge or DMA engine, and not the Intel E810 Ethernet adapter.
    assert [(a["pci_bus_id"], a["kind"]) for a in found] == [
        ("0b:00.0", "ethernet (RoCE)"), ("1a:00.0", "infiniband"), ("3c:00.0", "infiniband")]
    assert found[1]["pci_id"] == "15b3:1021"


def test_rdma_adapter_roce_on_an_hgx_h100():
    # The recorded HGX H100 has a ConnectX-7 in Ethernet mode.
    found = host_mod.parse_rdma_adapters(fixture_text("h100.lspci"))
    assert [(a["pci_bus_id"], a["kind"]) for a in found] == [("1b:00.0", "ethernet (RoCE)")]


@pytest.mark.parametrize("fixture", ["a100.lspci", "t4.lspci", "no-gpu.lspci", "rtx4090.lspci"])
def test_no_rdma_adapter(fixture):
    assert host_mod.parse_rdma_adapters(fixture_text(fixture)) == []


def fake_pci(root: Path, slot: str, cls: str, vendor: str, device: str) -> None:
    d = root / slot
    d.mkdir(parents=True)
    (d / "class").write_text(cls + "\n")
    (d / "vendor").write_text(vendor + "\n")
    (d / "device").write_text(device + "\n")


def test_sysfs_listing_without_lspci(tmp_path):
    # What the kernel lists in /sys/bus/pci/devices before pciutils is installed.
    fake_pci(tmp_path, "0000:18:00.0", "0x030200", "0x10de", "0x2330")
    fake_pci(tmp_path, "0000:07:00.0", "0x068000", "0x10de", "0x22a3")  # NVSwitch
    fake_pci(tmp_path, "0000:1a:00.0", "0x020700", "0x15b3", "0x1021")
    fake_pci(tmp_path, "0000:00:00.0", "0x060000", "0x8086", "0x09a2")
    (tmp_path / "0000:ff:00.0").mkdir()  # a device whose files cannot be read is left out
    text = host_mod.sysfs_pci_listing(str(tmp_path))
    assert "0000:07:00.0 Class [0680]: Device [10de:22a3]" in text.splitlines()
    gpus = gpu_mod.parse_lspci(text)
    assert [(g["pci_bus_id"], g["compute_capability"]) for g in gpus] == [("0000:18:00.0", "9.0")]
    assert [a["pci_bus_id"] for a in host_mod.parse_rdma_adapters(text)] == ["0000:1a:00.0"]
    assert host_mod.sysfs_pci_listing(str(tmp_path / "absent")) == ""


SMI_FAILED = "nvidia-smi failed (rc {}): {}"
MISMATCH = SMI_FAILED.format(
    18, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.95")
NO_DRIVER = SMI_FAILED.format(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                                 "Make sure that the latest NVIDIA driver is installed and running.")


def test_reboot_after_driver_change_blocks_cuda():
    state = host_mod.reboot_state([MISMATCH], False, [])
    assert state["pending"] and state["blocks_cuda"]
    assert "Driver/library version mismatch" in state["reasons"][0]


def test_reboot_flagged_and_no_driver_blocks_cuda():
    # nvidia_driver wrote /run/reboot-required after a first install (nouveau bound).
    state = host_mod.reboot_state([NO_DRIVER], True, [])
    assert state["blocks_cuda"]
    assert state["reasons"] == ["/var/run/reboot-required is present", "nvidia-smi cannot reach the NVIDIA driver"]


def test_no_driver_without_reboot_flag_is_for_the_driver_role():
    # A host with GPUs and no driver yet: nvidia_driver installs one; no reboot pending.
    assert host_mod.reboot_state([NO_DRIVER], False, []) == {"pending": False, "blocks_cuda": False, "reasons": []}


def test_kernel_update_reboot_is_reported_only():
    pkgs = host_mod.parse_reboot_required_pkgs("linux-image-6.8.0-51-generic\nlinux-base\nlinux-base\n")
    assert pkgs == ["linux-base", "linux-image-6.8.0-51-generic"]
    state = host_mod.reboot_state([], True, pkgs)
    assert state["pending"] and not state["blocks_cuda"]
    assert state["reasons"] == ["/var/run/reboot-required is present (for linux-base, linux-image-6.8.0-51-generic)"]
    assert host_mod.parse_reboot_required_pkgs(None) == []


def test_architecture():
    assert arch_mod.architecture_problem("node1", "x86_64") == ""
    msg = arch_mod.architecture_problem("gh200-1", "aarch64")
    assert msg.startswith("gh200-1: CPU architecture aarch64 (Grace Hopper")
    assert "sbsa" in msg and "Needs: an x86_64 host." in msg
    assert arch_mod.architecture_problem("p9", "ppc64le").startswith("p9: CPU architecture ppc64le; ")
