"""Facts the shipped compatibility matrix must respect, checked on the real file
(roles/preflight/files/compat_matrix.yml), not on a copy."""

import pytest
import yaml
from matrix_table import MATRIX
from rolepy import ROOT, gpu_mod, shared, stack_mod

# ------------------------------------------------------------------- the facts
# Every fact about NVIDIA's and PyTorch's packaging that the matrix must follow,
# here once, each with its source. The tests below check every row against them.

# PyTorch's wheel variants per release (the CUDA columns of PyTorch's release
# compatibility matrix, https://github.com/pytorch/pytorch/blob/main/RELEASE.md#release-compatibility-matrix,
# and the variants download.pytorch.org/whl/<variant>/torch/ holds): 2.12 dropped
# cu128; 2.14 is built for cu126, cu130 and cu132.
WHEEL_VARIANTS = {
    "2.14": {"cu126", "cu130", "cu132", "cpu"},
    "2.11": {"cu126", "cu128", "cu130", "cpu"},
    "2.10": {"cu126", "cu128", "cu130", "cpu"},
    "2.7": {"cu118", "cu126", "cu128", "cpu"},
    "2.6": {"cu118", "cu124", "cu126", "cpu"},
}

# CPython versions PyTorch publishes Linux wheels for (the Python column of the
# same matrix; the experimental free-threaded builds left out).
TORCH_PYTHON = {
    "2.14": ["3.10", "3.11", "3.12", "3.13", "3.14", "3.15"],
    "2.11": ["3.10", "3.11", "3.12", "3.13", "3.14"],
    "2.10": ["3.10", "3.11", "3.12", "3.13", "3.14"],
    "2.7": ["3.9", "3.10", "3.11", "3.12", "3.13"],
    "2.6": ["3.9", "3.10", "3.11", "3.12", "3.13"],
}

# The first CUDA toolkit in NVIDIA's apt repository per OS release
# (https://developer.download.nvidia.com/compute/cuda/repos/<os>/x86_64/: the
# oldest cuda-toolkit-X-Y there): ubuntu2204 from 11.7, debian12 from 12.3
# (no cuda-toolkit-11-8 and no R520 driver there), ubuntu2404 from 12.5.
FIRST_CUDA = {"ubuntu2204": (11, 7), "debian12": (12, 3), "ubuntu2404": (12, 5)}

# The minimum Linux x86_64 driver of each toolkit a row installs (NVIDIA's CUDA
# toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions"
# table, https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/; 13.2 Update 1
# in https://docs.nvidia.com/cuda/archive/13.2.1/cuda-toolkit-release-notes/).
MIN_DRIVER = {
    "13.2": "595.58.03",  # 13.2 Update 1 (13.2.1): cu132 is built with it
    "13.0": "580.65.06",  # 13.0 GA
    "12.8": "570.26",  # 12.8 GA
    "12.6": "560.28.03",  # 12.6 GA
    "12.4": "550.54.14",  # 12.4 GA
    "11.8": "520.61.05",  # 11.8 GA
}

# The last driver branch that supports Kepler (compute capability 3.x) is R470.
LAST_KEPLER_BRANCH = 470
# NVIDIA's ubuntu2404 CUDA repository starts at CUDA 12.5.
UBUNTU2404_FIRST_CUDA = FIRST_CUDA["ubuntu2404"]


@pytest.fixture(scope="module")
def rows():
    assert MATRIX == ROOT / "roles" / "preflight" / "files" / "compat_matrix.yml"
    loaded = stack_mod.load_matrix(MATRIX.read_text())
    assert loaded["errors"] == []
    return loaded["rows"]


def gpu_rows(rows, variant=None):
    return [r for r in rows if r["variant"] != "cpu" and (variant is None or r["variant"] == variant)]


def cuda(row):
    return stack_mod.version_tuple(row["cuda"])[:2]


@pytest.mark.parametrize("variant", ["cu118", "cu124"])
def test_no_ubuntu2404_before_cuda_12_5(rows, variant):
    listed = gpu_rows(rows, variant)
    assert listed, f"the matrix has no {variant} row any more: update this test"
    for r in listed:
        assert "ubuntu2404" not in r["os"], f"{stack_mod.label(r)} lists ubuntu2404"


def test_ubuntu2404_only_with_cuda_12_5_or_newer(rows):
    wrong = [stack_mod.label(r) for r in gpu_rows(rows) if "ubuntu2404" in r["os"] and cuda(r) < UBUNTU2404_FIRST_CUDA]
    assert wrong == []


def release(row):
    return stack_mod.torch_release(row["torch"])


def test_every_rows_variant_is_one_pytorch_builds_for_its_release(rows):
    # Before: a 2.14.1 cu128 row, a wheel that does not exist (pip found nothing).
    wrong = [stack_mod.label(r) for r in rows if r["variant"] not in WHEEL_VARIANTS.get(release(r), set())]
    assert wrong == []


def test_newest_release_has_every_cuda_variant_pytorch_builds(rows):
    newest = max((r["torch"] for r in rows), key=stack_mod.version_tuple)
    have = {r["variant"] for r in rows if r["torch"] == newest}
    assert have == WHEEL_VARIANTS[stack_mod.torch_release(newest)]


@pytest.mark.parametrize("os_release", sorted(FIRST_CUDA))
def test_every_row_lists_only_os_repositories_that_have_its_cuda(rows, os_release):
    wrong = [
        stack_mod.label(r)
        for r in gpu_rows(rows)
        if os_release in r["os"] and cuda(r) < FIRST_CUDA[os_release]
    ]
    assert wrong == [], f"NVIDIA's {os_release} repository starts at CUDA {FIRST_CUDA[os_release]}"


def test_every_row_lists_only_os_releases_the_facts_know(rows):
    for r in rows:
        assert set(r["os"]) <= set(FIRST_CUDA), stack_mod.label(r)


def test_every_rows_python_versions_are_its_releases(rows):
    for r in rows:
        assert r["python"] == TORCH_PYTHON[release(r)], stack_mod.label(r)


def test_matrix_python_table_is_the_facts():
    for torch_release, versions in yaml.safe_load(MATRIX.read_text())["torch_python"].items():
        assert versions == TORCH_PYTHON[torch_release], torch_release


def test_every_rows_min_driver_is_its_toolkits(rows):
    for r in gpu_rows(rows):
        assert r["min_driver"] == MIN_DRIVER[r["cuda"]], stack_mod.label(r)


def test_cu118_does_not_list_kepler(rows):
    listed = gpu_rows(rows, "cu118")
    assert listed
    for r in listed:
        assert "3.7" not in r["compute_capabilities"], f"{stack_mod.label(r)} lists 3.7"


def test_no_kepler_on_drivers_after_r470(rows):
    # Every row's driver branch is newer than R470, so none can run a 3.x GPU.
    wrong = [
        stack_mod.label(r)
        for r in gpu_rows(rows)
        if int(r["driver_branch"]) > LAST_KEPLER_BRANCH
        and any(stack_mod.version_tuple(c)[0] < 5 for c in r["compute_capabilities"])
    ]
    assert wrong == []


@pytest.mark.parametrize(
    "lspci,cc",
    [
        ("04:00.0 3D controller [0302]: NVIDIA Corporation GK210GL [Tesla K80] [10de:102d] (rev a1)\n", "3.7"),
        ("04:00.0 3D controller [0302]: NVIDIA Corporation GK110BGL [Tesla K40m] [10de:1023] (rev a1)\n", "3.5"),
    ],
)
def test_kepler_host_gets_no_row(rows, lspci, cc):
    gpus = gpu_mod.parse_lspci(lspci)
    assert [g["compute_capability"] for g in gpus] == [cc]
    host = {
        "name": "k",
        "os": "ubuntu2204",
        "os_name": "Ubuntu 22.04.5 LTS",
        "gpu_group": True,
        "cpu_group": False,
        "gpus": gpus,
        "gpu_count": 1,
        "driver_version": None,
        "manage_driver": True,
        "secure_boot": False,
        "signing_key": None,
        "signing_key_enrolled": False,
        "free_bytes": 50 * 1024**3,
        "min_free_gib": 10,
        "disk_path": "/opt",
    }
    chosen = stack_mod.select_stack(rows, [host], None, None)
    assert chosen["row"] is None
    assert f"has compute capability {cc}, too old for" in " ".join(chosen["problems"]["k"])


# ---------------------------------------------------------------- driver branches
# The catalogue the nvidia_driver role's branch policy chooses from
# (compat_matrix.yml: driver_branches), checked against NVIDIA's lifecycle.

drv = shared("torchrig_driver")


@pytest.fixture(scope="module")
def branches():
    return drv.check_catalogue(yaml.safe_load(MATRIX.read_text())["driver_branches"])


def test_every_rows_driver_is_in_the_catalogue(rows, branches):
    listed = {(b["branch"], b["version"]) for b in branches}
    for r in gpu_rows(rows):
        assert (r["driver_branch"], r["driver_version"]) in listed, stack_mod.label(r)


def test_branch_kinds_follow_nvidias_lifecycle(branches):
    kinds = {b["branch"]: b["kind"] for b in branches}
    # NVIDIA's support table (drivers/620/supported-drivers-and-cuda-toolkit-versions.html).
    assert kinds["620"] == "long_term" and kinds["580"] == "long_term"
    assert kinds.get("595", "production") == "production"
    assert {kinds[b] for b in ("570", "560", "550", "535", "520")} == {"ended"}


def test_blackwell_needs_r570_or_newer(branches):
    for b in branches:
        assert (drv.cc_tuple(b["max_cc"]) >= (10, 0)) == (int(b["branch"]) >= 570), b["branch"]


def test_r580_still_runs_maxwell_pascal_volta(branches):
    r580 = next(b for b in branches if b["branch"] == "580")
    assert drv.covers(r580, ["5.0", "6.0", "7.0"])


def test_default_policy_gives_every_row_a_long_term_or_production_branch(rows, branches):
    for r in gpu_rows(rows):
        chosen = drv.choose_branch(branches, "supported", r["min_driver"], r["compute_capabilities"])
        kind = next(b["kind"] for b in branches if b["branch"] == chosen["branch"])
        assert kind in ("long_term", "production"), stack_mod.label(r)
        assert drv.version_tuple(chosen["version"]) >= drv.version_tuple(r["min_driver"]), stack_mod.label(r)
