"""health.yml's GPU checks (the gpu_health module's parsers) on recorded output."""

import pytest
from rolepy import fixture_text, load

health = load("roles/preflight/module_utils/torchrig_health.py", "torchrig_health")
IGNORE = list(health.APPLICATION_XIDS)


def problems(smi=None, expected=0, smi_error=None, xids=(), dcgm=None, dcgm_error=None, persistence=True):
    return health.health_problems("gpu1", expected, smi, smi_error, list(xids), IGNORE, dcgm, dcgm_error,
                                  persistence)


def test_real_h200_is_healthy():
    # Captured on a real H200 (PCIe passthrough VM): no NVSwitch, fabric N/A.
    smi = health.parse_nvidia_smi_q(fixture_text("h200.nvidia-smi-q"))
    assert smi["driver_version"] == "580.159.04"
    assert smi["attached_gpus"] == 1
    (gpu,) = smi["gpus"]
    assert gpu["pci_bus_id"] == "00000000:00:06.0"
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["persistence_mode"] == "Enabled"
    assert gpu["ecc_mode"] == "Enabled"
    assert gpu["ecc_uncorrectable_volatile"] == 0
    assert gpu["ecc_uncorrectable_aggregate"] == 0
    assert (gpu["fabric_state"], gpu["fabric_status"]) == ("N/A", "N/A")
    assert problems(smi, expected=1) == []


def test_hgx_h100_fabric_completed_is_healthy():
    smi = health.parse_nvidia_smi_q(fixture_text("h100-hgx-2x.nvidia-smi-q"))
    assert [g["pci_bus_id"] for g in smi["gpus"]] == ["00000000:18:00.0", "00000000:2A:00.0"]
    assert {(g["fabric_state"], g["fabric_status"]) for g in smi["gpus"]} == {("Completed", "Success")}
    assert problems(smi, expected=2) == []


def test_hgx_h100_faults():
    smi = health.parse_nvidia_smi_q(fixture_text("h100-hgx-2x-faults.nvidia-smi-q"))
    g0, g1 = smi["gpus"]
    assert g0["fabric_state"] == "In Progress"
    assert (g1["ecc_uncorrectable_volatile"], g1["ecc_uncorrectable_aggregate"]) == (2, 3)
    assert g1["rows_remap_pending"] and not g1["rows_remap_failed"]
    found = problems(smi, expected=2)
    assert len(found) == 5, found
    assert found[0].startswith("gpu1: GPU 0 (NVIDIA H100 80GB HBM3, PCI 00000000:18:00.0) has persistence mode off")
    assert "fabric state 'In Progress', status 'N/A'" in found[1] and "nvidia-fabricmanager" in found[1]
    assert "GPU 1 (NVIDIA H100 80GB HBM3, PCI 00000000:2A:00.0) has 2 uncorrectable ECC error(s) since the " \
           "driver loaded (3 in its lifetime)" in found[2]
    assert "row remap or page retirement pending" in found[3]
    # Persistence mode as a report only.
    assert len(problems(smi, expected=2, persistence=False)) == 3


def test_old_driver_format_double_bit_and_retired_pages():
    smi = health.parse_nvidia_smi_q(fixture_text("v100-r470.nvidia-smi-q"))
    (gpu,) = smi["gpus"]
    assert gpu["ecc_mode"] == "Enabled"
    # Single-bit errors are corrected and do not count; the Double Bit totals do.
    assert (gpu["ecc_uncorrectable_volatile"], gpu["ecc_uncorrectable_aggregate"]) == (1, 1)
    assert gpu["pages_retirement_pending"]
    assert gpu["fabric_state"] is None  # no Fabric section before R470's successors
    assert len(problems(smi, expected=1)) == 2


def test_gpu_count_against_preflight():
    smi = health.parse_nvidia_smi_q(fixture_text("h100-hgx-2x.nvidia-smi-q"))
    (msg,) = problems(smi, expected=8)
    assert msg.startswith("gpu1: nvidia-smi sees 2 GPU(s), preflight found 8")


def test_smi_tree_process_entries():
    tree = health.parse_smi_tree(fixture_text("v100-r470.nvidia-smi-q"))
    procs = tree["GPU 00000000:00:1E.0"]["Processes"]
    assert procs["Process ID 4127"]["Name"] == "/opt/torchrig/venv/bin/python"


def test_not_nvidia_smi_q_output():
    with pytest.raises(ValueError, match="not nvidia-smi -q output"):
        health.parse_nvidia_smi_q("Failed to initialize NVML: Driver/library version mismatch\n")
    (msg,) = problems(smi_error="rc 18: Failed to initialize NVML: Driver/library version mismatch")
    assert msg.startswith("gpu1: nvidia-smi -q failed: rc 18: Failed to initialize NVML")


def test_xids_from_the_journal():
    xids = health.parse_xids(fixture_text("xid.journalctl"))
    assert [(x["pci_bus_id"], x["xid"]) for x in xids] == [
        ("0000:18:00", 13), ("0000:18:00", 13), ("0000:18:00", 43), ("0000:2a:00", 94), ("0000:2a:00", 63),
        ("0000:db:00", 79)]
    assert xids[-1]["detail"] == "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    found = problems(xids=xids)
    # 13 and 43 came from the user's program (an out-of-range address): reported, not counted.
    assert [m.split(" (")[0] for m in found] == [
        "gpu1: Xid 63 on PCI 0000:2a:00", "gpu1: Xid 94 on PCI 0000:2a:00", "gpu1: Xid 79 on PCI 0000:db:00"]
    assert "GPU has fallen off the bus" in found[2]


def test_xids_from_dmesg():
    xids = health.parse_xids(fixture_text("xid.dmesg"))
    assert [x["xid"] for x in xids] == [48, 45, 31]
    (msg,) = problems(xids=xids)
    assert msg.startswith("gpu1: Xid 48 on PCI 0000:00:1e (1 time(s) since boot), first: pid=3312, name=python3, "
                          "An uncorrectable double bit error (DBE)")


def test_dcgmi_diag_pass():
    dcgm = health.parse_dcgmi_diag(fixture_text("dcgmi-diag-r1-pass.txt"))
    assert len(dcgm["tests"]) == 9
    assert {t["category"] for t in dcgm["tests"]} == {"Deployment"}
    assert dcgm["failed"] == [] and dcgm["warned"] == []
    assert problems(dcgm=dcgm) == []


def test_dcgmi_diag_fail():
    dcgm = health.parse_dcgmi_diag(fixture_text("dcgmi-diag-r1-fail.txt"))
    assert [t["test"] for t in dcgm["failed"]] == ["Persistence Mode", "Page Retirement/Row Remap"]
    assert [t["status"] for t in dcgm["tests"] if t["test"] == "Inforom"] == ["skip"]
    found = problems(dcgm=dcgm)
    assert found[0].startswith("gpu1: dcgmi diag test 'Persistence Mode' failed: Warning: GPU 0 Persistence mode")
    assert "row remapping failed" in found[1].replace("a nd", "and")


def test_dcgmi_diag_without_host_engine():
    dcgm = health.parse_dcgmi_diag(fixture_text("dcgmi-diag-no-hostengine.txt"))
    assert dcgm["tests"] == []
    (msg,) = problems(dcgm_error="rc 255: Error: unable to establish a connection to the specified host: localhost")
    assert "nvidia-dcgm" in msg


def test_dcgm4_warning_rows_belong_to_their_test():
    # DCGM 4 prints "| Warning: GPU1 | ... |"; before, each such row became a test
    # of its own, "passed", and its text was lost.
    dcgm = health.parse_dcgmi_diag(fixture_text("dcgmi-diag-r1-dcgm4-warn.txt"))
    assert [t["test"] for t in dcgm["tests"]] == ["software"]
    (software,) = dcgm["warned"]
    assert software["status"] == "warn" and dcgm["failed"] == []
    notes = [d for d in software["details"] if d.startswith("Warning: GPU1: ")]
    assert len(notes) == 2
    assert notes[0].startswith("Warning: GPU1: Persistence mode for GPU 1 is disabled.")
    (msg,) = problems(dcgm=dcgm)
    assert msg.startswith("gpu1: dcgmi diag test 'software' warned: GPU0: Pass GPU1: Warn Warning: GPU1: Persistence")
    assert "pending row remap" in msg and "Needs: what the warning asks for" in msg


def test_r580_ecc_fields_of_the_real_h200_are_read():
    (gpu,) = health.parse_nvidia_smi_q(fixture_text("h200.nvidia-smi-q"))["gpus"]
    assert (gpu["ecc_unrepairable_memory"], gpu["ecc_channel_repair_pending"], gpu["ecc_tpc_repair_pending"],
            gpu["ecc_sram_threshold_exceeded"]) == (False, False, False, False)


def test_r580_ecc_faults_are_flagged():
    # The real H200 capture with R580's four new ECC fields set to Yes; before,
    # health found nothing wrong with it.
    smi = health.parse_nvidia_smi_q(fixture_text("h200-r580-ecc-faults.nvidia-smi-q"))
    found = problems(smi=smi, expected=1)
    assert len(found) == 3, found
    assert "reports Unrepairable Memory" in found[0] and "Needs: the GPU replaced." in found[0]
    assert "has a Channel and a TPC repair pending. Needs: a GPU reset or reboot" in found[1]
    assert "SRAM Threshold Exceeded: Yes" in found[2]
    assert all(m.startswith("gpu1: GPU 0 (NVIDIA H200") for m in found)


def test_older_drivers_have_no_r580_ecc_fields():
    (gpu,) = health.parse_nvidia_smi_q(fixture_text("v100-r470.nvidia-smi-q"))["gpus"][:1]
    assert gpu["ecc_unrepairable_memory"] is None and gpu["ecc_sram_threshold_exceeded"] is None
