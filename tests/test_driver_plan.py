"""The nvidia_driver role's plan (branch policy, kernel modules, Fabric Manager)
and its fabric-state parser, on recorded lspci and nvidia-smi -q output."""

import pytest
import yaml
from rolepy import MATRIX_TEXT, fixture_text, load

drv = load("roles/nvidia_driver/module_utils/torchrig_driver.py", "torchrig_driver")
CATALOGUE = yaml.safe_load(MATRIX_TEXT)["driver_branches"]
ROWS = {(r["torch"], r["variant"]): r for r in yaml.safe_load(MATRIX_TEXT)["rows"]}
PACKAGES = yaml.safe_load(
    """
Debian: {open: [nvidia-open, nvidia-kernel-open-dkms], proprietary: [cuda-drivers, nvidia-kernel-dkms]}
Ubuntu:
  open: ["nvidia-driver-{branch}-open", "nvidia-dkms-{branch}-open"]
  proprietary: ["cuda-drivers-{branch}", "nvidia-dkms-{branch}"]
"""
)


def plan(ccs, lspci="", row=("2.14.1", "cu130"), distribution="Debian", **kw):
    r = ROWS[row]
    args = dict(
        catalogue=CATALOGUE,
        policy="supported",
        floor=r["min_driver"],
        host_ccs=ccs,
        cluster_ccs=ccs,
        distribution=distribution,
        packages_by_os=PACKAGES,
        lspci=lspci,
        stack={"branch": r["driver_branch"], "version": r["driver_version"]},
    )
    args.update(kw)
    return drv.plan(**args)


# ---------------------------------------------------------------- NVSwitch


def test_hgx_h100_gets_fabric_manager_at_the_driver_version():
    p = plan(["9.0"], fixture_text("hgx-h100-8x.lspci"))
    assert len(p["nvswitches"]) == 4
    assert p["nvswitches"][0] == {"pci_bus_id": "05:00.0", "pci_device_id": "10de:22a3"}
    assert p["fabricmanager"] and not p["nvlsm"]
    assert p["branch"] == "580" and p["upstream"] == "580.95.05"
    assert p["fabric_packages"] == ["nvidia-fabricmanager", "libnvidia-nscq"]
    # Installed at the driver's version and held with it.
    assert p["versioned_packages"] == [
        "nvidia-open",
        "nvidia-kernel-open-dkms",
        "nvidia-fabricmanager",
        "libnvidia-nscq",
    ]
    assert p["hold"] == p["versioned_packages"]


def test_the_short_h100_fixture_with_two_nvswitches_also_counts():
    assert len(drv.parse_nvswitches(fixture_text("h100.lspci"))) == 2


@pytest.mark.parametrize("fixture", ["h100-pcie.lspci", "a100.lspci", "v100.lspci", "rtx4090.lspci", "no-gpu.lspci"])
def test_no_nvswitch_no_fabric_manager(fixture):
    p = plan(["9.0"], fixture_text(fixture))
    assert p["nvswitches"] == [] and not p["fabricmanager"]
    assert p["fabric_packages"] == [] and p["hold"] == ["nvidia-open", "nvidia-kernel-open-dkms"]


def test_fabric_packages_named_with_the_branch_before_r580():
    p = plan(["9.0"], fixture_text("hgx-h100-8x.lspci"), policy="stack", row=("2.11.0", "cu128"))
    assert p["branch"] == "570"
    assert p["fabric_packages"] == ["nvidia-fabricmanager-570", "libnvidia-nscq-570"]


def test_blackwell_hgx_also_gets_nvlsm_and_nvsdm():
    p = plan(["10.0"], fixture_text("hgx-h100-8x.lspci"))
    assert p["nvlsm"] and p["kernel_modules"] == "open"
    assert p["fabric_packages"] == ["nvidia-fabricmanager", "libnvidia-nscq", "libnvsdm", "nvlsm"]
    # nvlsm has its own version scheme: held, not pinned to the driver's.
    assert p["other_packages"] == ["nvlsm"] and "nvlsm" not in p["versioned_packages"]


def test_ubuntu_names_carry_the_branch():
    p = plan(["9.0"], fixture_text("hgx-h100-8x.lspci"), distribution="Ubuntu")
    assert p["driver_packages"] == ["nvidia-driver-580-open", "nvidia-dkms-580-open"]


def test_fabric_manager_forced_off_and_on():
    assert not plan(["9.0"], fixture_text("hgx-h100-8x.lspci"), fabricmanager="never")["fabricmanager"]
    assert plan(["9.0"], "", fabricmanager="always")["fabricmanager"]


def test_another_branchs_fabric_packages_are_replaced():
    installed = {
        "nvidia-kernel-open-dkms": "570.172.08-1",
        "nvidia-open": "570.172.08-1",
        "nvidia-fabricmanager-570": "570.172.08-1",
        "libnvidia-nscq-570": "570.172.08-1",
    }
    p = plan(["9.0"], fixture_text("hgx-h100-8x.lspci"), installed=installed)
    assert p["change"] and p["branch"] == "580"
    assert p["stale_packages"] == ["libnvidia-nscq-570", "nvidia-fabricmanager-570"]


# ---------------------------------------------------------------- branch policy


@pytest.mark.parametrize(
    "row,ccs",
    [(("2.14.1", "cu126"), ["7.0"]), (("2.7.1", "cu118"), ["6.0", "7.0"]), (("2.14.1", "cu130"), ["9.0"])],
)
def test_default_policy_takes_the_newest_long_term_branch(row, ccs):
    # Volta on cu126 used to get R560 and cu118 R520: short-lived branches.
    p = plan(ccs, row=row)
    assert p["branch"] == "580" and p["policy_choice"]["why"].startswith("newest long-term")
    assert drv.version_tuple(p["version"]) >= drv.version_tuple(ROWS[row]["min_driver"])


def test_branch_max_keeps_the_policy_at_or_below_it():
    p = plan(["7.0"], row=("2.14.1", "cu126"), branch_max="570")
    assert p["branch"] == "570"  # production, not the new-feature 560


def test_a_branch_below_the_floor_is_refused():
    with pytest.raises(drv.PlanError, match="older than the stack's minimum 580.65.06"):
        plan(["9.0"], branch="570")
    with pytest.raises(drv.PlanError, match="meets the minimum driver 580.65.06 within nvidia_driver_branch_max 570"):
        plan(["9.0"], branch_max="570")


def test_a_branch_that_cannot_run_the_gpus_is_refused():
    with pytest.raises(drv.PlanError, match="supports compute capability 5.0 to 9.0; the cluster has 10.0"):
        plan(["10.0"], row=("2.14.1", "cu126"), branch="560")


def test_the_cluster_decides_the_branch():
    # A Blackwell node elsewhere in the cluster: the branch must run it too.
    p = plan(["7.0"], row=("2.14.1", "cu126"), cluster_ccs=["10.0"], branch_max="570")
    assert p["branch"] == "570" and p["kernel_modules"] == "proprietary"


def test_stack_policy_is_the_old_behaviour():
    p = plan(["7.0"], row=("2.14.1", "cu126"), policy="stack")
    assert (p["branch"], p["version"]) == ("560", "560.35.05-1")


@pytest.mark.parametrize(
    "bad,message",
    [
        (dict(floor=""), "no minimum driver"),
        (dict(policy="latest"), "expected one of supported, long_term, stack"),
        (dict(branch="999"), "nvidia_driver_branch 999 is not in driver_branches"),
        (dict(branch_max="r570"), "expected a branch number like 570"),
        (dict(distribution="Fedora"), "no driver packages are named for Fedora"),
        (dict(fabricmanager="yes"), "nvidia_driver_fabricmanager is 'yes'; expected auto, always or never"),
        (
            dict(
                catalogue=[
                    {"branch": "580", "kind": "lts", "version": "580.95.05-1", "min_cc": "5.0", "max_cc": "12.0"}
                ]
            ),
            "kind 'lts'; expected one of long_term",
        ),
        (
            dict(
                catalogue=[
                    {"branch": "580", "kind": "long_term", "version": "570.1-1", "min_cc": "5.0", "max_cc": "12.0"}
                ]
            ),
            "version 570.1-1 is not on branch 580",
        ),
    ],
)
def test_bad_input_names_what_is_wrong(bad, message):
    with pytest.raises(drv.PlanError, match=message):
        plan(["9.0"], **bad)


# ---------------------------------------------------------------- no downgrade


def test_a_newer_driver_that_meets_the_floor_is_kept():
    installed = {"cuda-drivers": "580.95.05-1", "nvidia-kernel-dkms": "580.95.05-1"}
    p = plan(["7.0"], row=("2.14.1", "cu126"), branch_max="570", installed=installed)
    assert p["policy_choice"]["branch"] == "570"
    assert p["kept"] and p["branch"] == "580" and p["upstream"] == "580.95.05"
    assert p["kernel_modules"] == "proprietary" and not p["change"]
    assert "not downgraded" in p["why"]


def test_downgrade_when_asked():
    installed = {"cuda-drivers": "580.95.05-1", "nvidia-kernel-dkms": "580.95.05-1"}
    p = plan(["7.0"], row=("2.14.1", "cu126"), branch_max="570", installed=installed, downgrade=True)
    assert not p["kept"] and p["branch"] == "570" and p["change"]


def test_an_older_driver_is_upgraded():
    installed = {"nvidia-open": "570.172.08-1", "nvidia-kernel-open-dkms": "570.172.08-1"}
    p = plan(["9.0"], installed=installed)
    assert not p["kept"] and p["branch"] == "580" and p["to_change"] == ["nvidia-open", "nvidia-kernel-open-dkms"]


def test_ubuntu_installed_driver_is_read_from_its_dkms_package():
    have = drv.installed_driver({"nvidia-dkms-590-open": "590.44.01-0ubuntu1", "dkms": "3.0.10-8"})
    assert have == {
        "package": "nvidia-dkms-590-open",
        "version": "590.44.01-0ubuntu1",
        "upstream": "590.44.01",
        "branch": "590",
        "flavor": "open",
    }


def test_a_kept_driver_must_have_the_modules_the_gpus_need():
    # Proprietary modules cannot run Blackwell: not kept, replaced.
    installed = {"cuda-drivers": "590.44.01-1", "nvidia-kernel-dkms": "590.44.01-1"}
    p = plan(["10.0"], installed=installed)
    assert not p["kept"] and p["kernel_modules"] == "open"


# ---------------------------------------------------------------- kernel modules


@pytest.mark.parametrize(
    "ccs,names,flavor",
    [
        (["7.0"], [], "proprietary"),
        (["6.0"], [], "proprietary"),
        (["5.2"], [], "proprietary"),
        (["7.0", "8.0"], [], "proprietary"),  # a mix uses proprietary
        (["7.5"], [], "open"),
        (["9.0"], [], "open"),
        (["9.0"], ["NVIDIA GH200 480GB"], "open"),
        (["10.0"], [], "open"),
        (["12.0"], [], "open"),
    ],
)
def test_kernel_modules_by_generation(ccs, names, flavor):
    assert drv.kernel_modules(ccs, names)[0] == flavor


def test_kernel_modules_conflicts_are_refused():
    with pytest.raises(drv.PlanError, match="need NVIDIA's open kernel modules and GPUs 7.0 the proprietary"):
        drv.kernel_modules(["7.0", "10.0"])
    with pytest.raises(drv.PlanError, match="is open, but compute capability 7.0"):
        drv.kernel_modules(["7.0"], override="open")
    with pytest.raises(drv.PlanError, match="is proprietary, but NVIDIA GH200 480GB"):
        drv.kernel_modules(["9.0"], ["NVIDIA GH200 480GB"], override="proprietary")
    assert drv.kernel_modules(["9.0"], override="proprietary") == ("proprietary", "nvidia_driver_kernel_modules")


# ---------------------------------------------------------------- fabric state


def test_hgx_h100_fabric_completed():
    gpus = drv.parse_fabric(fixture_text("hgx-h100-8x.nvidia-smi-q"))
    assert len(gpus) == 8
    assert gpus[0] == {"gpu": "00000000:18:00.0", "state": "Completed", "status": "Success"}
    assert drv.fabric_problems(gpus) == []


def test_hgx_h100_fabric_in_progress():
    problems = drv.fabric_problems(drv.parse_fabric(fixture_text("hgx-h100-8x-fabric-in-progress.nvidia-smi-q")))
    assert problems == [
        "GPU 00000000:9A:00.0: fabric state In Progress, expected Completed",
        "GPU 00000000:AB:00.0: fabric state In Progress, expected Completed",
    ]


@pytest.mark.parametrize("fixture", ["h100-pcie.nvidia-smi-q", "h200.nvidia-smi-q"])
def test_no_fabric_reads_not_applicable(fixture):
    gpus = drv.parse_fabric(fixture_text(fixture))
    assert {g["state"] for g in gpus} == {"N/A"}
    assert drv.fabric_problems(gpus)[0].endswith("fabric state N/A, expected Completed")


def test_completed_with_an_error_status_is_not_ready():
    text = "GPU 00000000:18:00.0\n    Fabric\n        State    : Completed\n        Status   : NVML_ERROR_UNKNOWN\n"
    assert drv.fabric_problems(drv.parse_fabric(text)) == [
        "GPU 00000000:18:00.0: fabric state Completed with status NVML_ERROR_UNKNOWN, expected Success"
    ]


def test_output_without_gpus_is_an_error():
    with pytest.raises(drv.PlanError, match="printed no GPU section"):
        drv.parse_fabric("No devices were found\n")
