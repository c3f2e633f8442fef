"""The nvidia_driver role's plan (branch policy, kernel modules, Fabric Manager)
and its fabric-state parser, on recorded lspci and nvidia-smi -q output."""

import pytest
import yaml
from rolepy import FIXTURES, MATRIX_TEXT, ROOT, fixture_text, shared

drv = shared("torchrig_driver")
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
        # The tests below were written for R580; the newer branches have their own.
        branch_max="580",
    )
    args.update(kw)
    return drv.plan(**args)


# ---------------------------------------------------------------- NVSwitch


def test_hgx_h100_gets_fabric_manager_at_the_driver_version():
    p = plan(["9.0"], fixture_text("hgx-h100-8x.lspci"))
    assert len(p["nvswitches"]) == 4
    assert p["nvswitches"][0] == {"pci_bus_id": "05:00.0", "pci_device_id": "10de:22a3"}
    assert p["fabricmanager"] and not p["nvlsm"]
    assert p["branch"] == "580" and p["pin"] == "580.*"
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
    assert plan(["9.0"], branch_max="600")["branch"] == "595"  # production, not the long-term 620
    # R570 has ended (NVIDIA's support table): no policy offers it any more.
    with pytest.raises(drv.PlanError, match="no long-term or production branch .* within nvidia_driver_branch_max 570"):
        plan(["7.0"], row=("2.14.1", "cu126"), branch_max="570")


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
    p = plan(["9.0"], cluster_ccs=["10.0"], branch_max="")
    assert p["branch"] == "620"
    # A Volta node elsewhere: only R580 still runs it.
    p = plan(["9.0"], cluster_ccs=["7.0"], branch_max="")
    assert p["branch"] == "580" and p["kernel_modules"] == "open"


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
    p = plan(["7.0"], row=("2.14.1", "cu126"), policy="stack", installed=installed)
    assert p["policy_choice"]["branch"] == "560"
    assert p["kept"] and p["branch"] == "580" and p["upstream"] == "580.95.05" and p["pin"] == "580.*"
    assert p["kernel_modules"] == "proprietary" and not p["change"]
    assert "not downgraded" in p["why"]


def test_downgrade_when_asked():
    installed = {"cuda-drivers": "580.95.05-1", "nvidia-kernel-dkms": "580.95.05-1"}
    p = plan(["7.0"], row=("2.14.1", "cu126"), policy="stack", installed=installed, downgrade=True)
    assert not p["kept"] and p["branch"] == "560" and p["change"]


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


# ---------------------------------------------------------------- issue 30 (part B)
# Each test below fails on a46a43a's role and passes now.

B200_SYSFS = str(FIXTURES / "gpu" / "hgx-b200-8x.sysfs")
UBUNTU = yaml.safe_load((ROOT / "roles/nvidia_driver/defaults/main.yml").read_text())["nvidia_driver_packages_by_os"]


def test_blackwell_hgx_found_through_the_sw_mng_bridges():
    # Item 1: no NVIDIA class-0680 function on a B200 board (NVLink 5); the
    # switch trays are managed through ConnectX bridges with SW_MNG in the VPD.
    lspci = fixture_text("hgx-b200-8x.lspci")
    assert drv.parse_nvswitches(lspci) == []
    devices = drv.read_pci_devices(B200_SYSFS)
    assert [b["pci_bus_id"] for b in drv.nvlink5_bridges(devices)] == ["0000:cc:00.0", "0000:cd:00.0"]
    p = plan(["10.0"], lspci, branch_max="", pci_devices=devices)
    assert p["fabricmanager"] and p["nvlsm"]
    assert p["fabric_packages"] == ["nvidia-fabricmanager", "libnvidia-nscq", "libnvsdm", "nvlsm", "infiniband-diags"]
    assert p["fabric_kernel_modules"] == ["mlx5_core", "ib_umad"]
    assert "infiniband-diags" in p["other_packages"] and "nvlsm" in p["hold"]


def test_an_h100_board_with_ordinary_connectx_is_not_nvlink5():
    assert drv.nvlink5_bridges([{"slot": "0000:1b:00.0", "vendor": "15b3", "device": "1021", "vpd": b"PN MCX75"}]) == []
    p = plan(["9.0"], fixture_text("hgx-h100-8x.lspci"))
    assert p["fabric_kernel_modules"] == [] and "infiniband-diags" not in p["fabric_packages"]


def test_the_catalogue_follows_nvidias_lifecycle():
    # Item 6: R595 production and R620 long-term offered; R535, R550, R570 not.
    kinds = {b["branch"]: b["kind"] for b in CATALOGUE}
    assert kinds["620"] == "long_term" and kinds["595"] == "production" and kinds["580"] == "long_term"
    assert {kinds[b] for b in ("570", "560", "550", "535", "520")} == {"ended"}
    assert plan(["9.0"], branch_max="")["branch"] == "620"
    assert plan(["9.0"], branch_max="", policy="long_term")["branch"] == "620"


def test_the_driver_follows_its_branch_not_a_point_release():
    # Item 6: pinned to "580.*"; an installed newer point release (a security
    # release) is kept, not taken back to the catalogue's 580.95.05, and never
    # moved to another branch; nvidia_driver_update brings the newest.
    newer = {"nvidia-open": "580.126.20-1", "nvidia-kernel-open-dkms": "580.126.20-1"}
    p = plan(["9.0"], installed=newer)
    assert p["pin"] == "580.*" and not p["change"] and p["upstream"] == "580.126.20"
    assert plan(["9.0"], installed=newer, update=True)["change"]
    older = {"nvidia-open": "580.82.07-1", "nvidia-kernel-open-dkms": "580.82.07-1"}
    assert plan(["9.0"], installed=older)["change"]
    # Fabric Manager at another point release than the driver: reinstalled together.
    mixed = dict(newer, **{"nvidia-fabricmanager": "580.95.05-1", "libnvidia-nscq": "580.126.20-1"})
    assert plan(["9.0"], fixture_text("hgx-h100-8x.lspci"), installed=mixed)["change"]
    # A version named by hand is pinned exactly.
    assert plan(["9.0"], branch="580", version="580.95.05-1")["pin"] == "580.95.05-*"


def test_ubuntu_r590_and_later_names_and_the_pinning_package():
    # Item 7: asking for 595 on Ubuntu gets the unversioned names and NVIDIA's
    # pinning package; 580 keeps the branch in the names.
    p = plan(["9.0"], distribution="Ubuntu", packages_by_os=UBUNTU, branch="595", branch_max="")
    assert p["driver_packages"] == ["nvidia-open", "nvidia-dkms-open"]
    assert p["pinning_packages"] == ["nvidia-driver-pinning-595"] and p["hold"][0] == "nvidia-driver-pinning-595"
    p = plan(["9.0"], distribution="Ubuntu", packages_by_os=UBUNTU)
    assert p["driver_packages"] == ["nvidia-driver-580-open", "nvidia-dkms-580-open"] and p["pinning_packages"] == []
    # Another branch's pinning package goes when this branch's comes.
    p = plan(
        ["9.0"],
        distribution="Ubuntu",
        packages_by_os=UBUNTU,
        branch="620",
        branch_max="",
        installed={"nvidia-driver-pinning-595": "595.58.03-1"},
    )
    assert p["stale_packages"] == ["nvidia-driver-pinning-595"]


def test_a_node_on_595_is_recognised_and_not_downgraded():
    # Item 7: Ubuntu's R590+ kernel module package has no branch in its name.
    installed = {"nvidia-open": "595.58.03-0ubuntu1", "nvidia-dkms-open": "595.58.03-0ubuntu1"}
    assert drv.installed_driver(installed)["branch"] == "595"
    p = plan(["9.0"], distribution="Ubuntu", packages_by_os=UBUNTU, installed=installed)
    assert p["policy_choice"]["branch"] == "580" and p["kept"] and p["branch"] == "595"
    assert p["driver_packages"] == ["nvidia-open", "nvidia-dkms-open"] and p["pin"] == "595.*"


def test_packages_by_os_in_a_bad_shape_is_refused():
    with pytest.raises(drv.PlanError, match="from_branch 'x' is not a branch number"):
        plan(["9.0"], packages_by_os={"Debian": [{"from_branch": "x", "open": ["a"]}]})


@pytest.mark.parametrize(
    "distribution,release,uname,meta",
    [
        ("Debian", "12", "6.1.0-18-amd64", "linux-headers-amd64"),
        ("Debian", "12", "6.1.0-28-cloud-amd64", "linux-headers-cloud-amd64"),
        ("Debian", "12", "6.12.9+bpo-amd64", "linux-headers-amd64"),
        ("Ubuntu", "22.04", "5.15.0-91-generic", "linux-headers-generic"),
        ("Ubuntu", "22.04", "6.8.0-49-generic", "linux-headers-generic-hwe-22.04"),
        ("Ubuntu", "24.04", "6.8.0-1015-aws", "linux-headers-aws"),
        ("Ubuntu", "24.04", "6.8.0-1012-nvidia", "linux-headers-nvidia"),
        ("Ubuntu", "24.04", "6.8.0-49-generic", "linux-headers-generic"),
    ],
)
def test_the_kernel_headers_meta_package_follows_the_flavour(distribution, release, uname, meta):
    # Item 10: DKMS can build for the next kernel only with its headers.
    assert drv.kernel_headers_meta(distribution, release, uname) == meta


def test_an_unreadable_kernel_release_is_refused():
    with pytest.raises(drv.PlanError, match="does not read as VERSION-ABI-FLAVOUR"):
        drv.kernel_headers_meta("Debian", "12", "6.1.0")


IB = {"pci_bus_id": "1b:00.0", "kind": "infiniband"}
ETH = {"pci_bus_id": "1b:00.0", "kind": "ethernet (RoCE)"}


def test_nvidia_peermem_only_where_it_is_needed_and_can_load():
    # Item 9: not by default; auto needs an InfiniBand HCA (not Ethernet, not an
    # NVLink 5 bridge), the peer-memory API, and no DMA-BUF.
    assert drv.peermem("never", [IB], peer_memory=True)[0] is False
    assert drv.peermem("auto", [ETH], peer_memory=True, flavor="proprietary")[0] is False
    bridge = {"pci_bus_id": "0000:cc:00.0", "pci_device_id": "15b3:1021"}
    assert (
        drv.peermem("auto", [{"pci_bus_id": "cc:00.0", "kind": "infiniband"}], [bridge], True, "proprietary")[0]
        is False
    )
    assert drv.peermem("auto", [IB], peer_memory=False, flavor="proprietary")[0] is False
    assert drv.peermem("auto", [IB], peer_memory=True, flavor="open", kernel_release="6.8.0-49-generic")[0] is False
    assert drv.peermem("auto", [IB], peer_memory=True, flavor="proprietary", kernel_release="6.8.0-49-generic")[0]
    assert drv.peermem(True)[0] and not drv.peermem(False)[0]
    with pytest.raises(drv.PlanError, match="expected never, auto or always"):
        drv.peermem("sometimes")


def test_the_role_defaults_load_no_peermem():
    defaults = yaml.safe_load((ROOT / "roles/nvidia_driver/defaults/main.yml").read_text())
    assert defaults["nvidia_driver_peermem"] == "never"


# ------------------------------------------- the kernel module (Secure Boot)
# Issue 30 item 8: preflight's Secure Boot guard asks the plan's own decision
# (driver_decision) whether the nvidia kernel module is rebuilt or replaced.


def dkms(version, flavor="open"):
    meta, module = (("nvidia-open", "nvidia-kernel-open-dkms") if flavor == "open"
                    else ("cuda-drivers", "nvidia-kernel-dkms"))
    return {meta: version, module: version}


def test_module_change_is_any_new_kernel_module():
    # Nothing installed: a first build.
    assert "no NVIDIA driver is installed" in plan(["9.0"])["module_change"]
    # The catalogue's point release on the branch: kept, no new module.
    assert plan(["9.0"], installed=dkms("580.95.05-1"))["module_change"] == ""
    # An older point release of the same branch: the newest is installed.
    p = plan(["9.0"], installed=dkms("580.82.07-1"))
    assert p["module_change"] == "driver 580.82.07 would be upgraded to the newest point release of branch 580"
    # nvidia_driver_update on the catalogue's release: a newer one may come.
    assert "(nvidia_driver_update)" in plan(["9.0"], installed=dkms("580.95.05-1"), update=True)["module_change"]
    # Another branch, another flavour: replaced.
    assert plan(["9.0"], installed=dkms("570.172.08-1"))["module_change"].startswith(
        "driver 570.172.08 would be replaced by branch 580"
    )
    assert "proprietary kernel modules would be replaced by the open ones" in plan(
        ["10.0"], installed=dkms("580.95.05-1", "proprietary")
    )["module_change"]
    # A newer branch that meets the floor is kept, update or not: no new module.
    assert plan(["9.0"], installed=dkms("595.58.03-1"), update=True)["module_change"] == ""


def test_a_fabric_only_change_is_no_module_change():
    # Fabric Manager missing on an NVSwitch board: the plan changes packages,
    # but the kernel module stays (Secure Boot has nothing new to load).
    p = plan(["9.0"], fixture_text("hgx-h100-8x.lspci"), installed=dkms("580.95.05-1"))
    assert p["change"] and p["module_change"] == ""


@pytest.mark.parametrize("installed,kw", [
    ("580.95.05", {}),
    ("580.82.07", {}),
    ("580.95.05", {"update": True}),
    ("560.35.05", {"policy": "stack", "row": ("2.14.1", "cu126")}),
    ("560.35.05", {"row": ("2.14.1", "cu126")}),
    ("580.95.05", {"branch_max": ""}),
    ("595.58.03", {"branch_max": ""}),
    ("580.95.05", {"branch": "580", "version": "580.95.05-1", "update": True}),
])
def test_preflight_asks_the_plan(installed, kw):
    # The guard (torchrig_stack.module_change) and the plan give the same answer
    # for the same settings: one decision, not two.
    from rolepy import stack_mod
    kw = dict(kw)
    row = ROWS[kw.pop("row", ("2.14.1", "cu130"))]
    expected = plan(["9.0"], row=(row["torch"], row["variant"]), installed=dkms(installed + "-1"), **kw)
    settings = {"policy": kw.get("policy", "supported"), "branches": CATALOGUE, "branch": kw.get("branch", ""),
                "version": kw.get("version", ""), "branch_max": kw.get("branch_max", "580"),
                "update": kw.get("update", False), "downgrade": False, "kernel_modules": "auto"}
    host = {"name": "node1", "driver_version": installed, "driver_plan": settings,
            "gpus": [{"compute_capability": "9.0", "name": "NVIDIA H100 80GB HBM3"}]}
    assert stack_mod.module_change(host, row) == expected["module_change"]
