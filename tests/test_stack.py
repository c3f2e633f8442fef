"""The compatibility matrix: its checks, host judgements and the choice of row."""

import pytest
import yaml
from rolepy import MATRIX_TEXT, fixture_text, gpu_mod, stack_mod

# The nvidia_driver role's defaults, as preflight_driver_plan hands them over.
DRIVER_PLAN = {
    "policy": "supported",
    "branches": yaml.safe_load(MATRIX_TEXT)["driver_branches"],
    "branch": "",
    "version": "",
    "branch_max": "",
    "update": False,
    "downgrade": False,
    "kernel_modules": "auto",
}


@pytest.fixture(scope="module")
def gpu():
    return gpu_mod


@pytest.fixture(scope="module")
def stack():
    return stack_mod


@pytest.fixture(scope="module")
def matrix_text():
    return MATRIX_TEXT


GIB = 1024**3


@pytest.fixture(scope="module")
def rows(stack, matrix_text):
    loaded = stack.load_matrix(matrix_text)
    assert loaded["errors"] == []
    return loaded["rows"]


def host(gpu_mod, name="node1", smi=None, group="gpu", **kw):
    gpus = gpu_mod.parse_nvidia_smi(fixture_text(smi)) if smi else []
    h = {
        "name": name,
        "os": "debian12",
        "os_name": "Debian 12.8",
        "gpu_group": group == "gpu",
        "cpu_group": group == "cpu",
        "gpus": gpus,
        "gpu_count": len(gpus),
        "driver_version": gpus[0]["driver_version"] if gpus else None,
        "manage_driver": True,
        "secure_boot": False,
        "signing_key": None,
        "signing_key_enrolled": False,
        "free_bytes": 50 * GIB,
        "min_free_gib": 10,
        "disk_path": "/opt",
        "driver_plan": dict(DRIVER_PLAN),
    }
    h.update(kw)
    return h


def pick(stack, rows, hosts, **kw):
    return stack.select_stack(rows, hosts, kw.get("torch"), kw.get("variant"))


# ------------------------------------------------------------------ matrix


def test_matrix_rows_are_complete(rows):
    assert len(rows) >= 10
    assert {r["variant"] for r in rows} >= {"cu130", "cu128", "cu126", "cpu"}


def test_cuda13_drops_old_gpus(rows):
    for r in rows:
        if r["variant"] == "cu130":
            assert min(float(c) for c in r["compute_capabilities"]) >= 7.5
            assert r["min_driver"].startswith("580")


@pytest.mark.parametrize(
    "text,needle",
    [
        ("rows: [\n  - torch: '2.1'\n  bad", "is not valid YAML at line"),
        ("rows: []\n", "non-empty list under the key rows"),
        ("- torch: '2.6.0'\n", "non-empty list under the key rows"),
        (
            "rows:\n  - {torch: 2.10, torchvision: '0.25.0', variant: cpu, compute_capabilities: [], os: [debian12]}\n",
            "torch must be a quoted string, got 2.1",
        ),
        (
            "rows:\n  - {torch: '2.6.0', torchvision: '0.21.0', variant: cu126,"
            " compute_capabilities: ['9.0'], os: [debian12]}\n",
            "row 1 (torch 2.6.0 cu126) lacks the key min_driver",
        ),
        (
            "rows:\n  - {torch: '2.6.0', torchvision: '0.21.0', variant: cpu,"
            " compute_capabilities: [], os: [debian12], index: x}\n",
            "unknown key index",
        ),
        (
            "rows:\n  - {torch: '2.6.0', torchvision: '0.21.0', variant: cpu,"
            " compute_capabilities: [], os: debian12}\n",
            "os must be a non-empty list",
        ),
    ],
)
def test_malformed_matrix(stack, text, needle):
    loaded = stack.load_matrix(text, "m.yml")
    assert loaded["rows"] == []
    assert any(needle in e for e in loaded["errors"]), loaded["errors"]
    assert all(e.startswith("m.yml") for e in loaded["errors"])


def test_matrix_duplicate_and_branch(stack, matrix_text):
    dup = matrix_text + matrix_text.split("rows:\n", 1)[1].split("  - torch", 2)[1].join(["  - torch", ""])
    assert any("repeats torch 2.14.1 cu132" in e for e in stack.load_matrix(dup)["errors"])
    wrong = matrix_text.replace('min_driver: "580.65.06"', 'min_driver: "575.51.03"', 1)
    assert any("not on driver_branch 580" in e for e in stack.load_matrix(wrong)["errors"])


# ------------------------------------------------------------------- hosts


@pytest.mark.parametrize(
    "dist,version,expected",
    [("Debian", "12.8", "debian12"), ("Ubuntu", "22.04", "ubuntu2204"), ("Ubuntu", "24.04", "ubuntu2404")],
)
def test_os_id(stack, dist, version, expected):
    assert stack.os_id(dist, version) == expected


@pytest.mark.parametrize(
    "cc,built,ok",
    [
        ("8.9", ["8.0", "8.6", "9.0"], True),  # Ada runs Ampere 8.6 code
        ("6.1", ["5.0", "6.0", "7.0"], True),
        ("6.0", ["7.5", "8.0"], False),
        ("8.0", ["8.6"], False),  # not downward in minor
        ("10.0", ["9.0"], False),  # not across majors
    ],
)
def test_cc_supported(stack, cc, built, ok):
    assert stack.cc_supported(cc, built) is ok


# ------------------------------------------------------------------ choice


@pytest.mark.parametrize(
    "smi,variant",
    [
        # The newest CUDA a managed driver can reach: cu132 (R595).
        ("h100-8x.nvidia-smi", "cu132"),
        ("a100-4x.nvidia-smi", "cu132"),
        ("t4.nvidia-smi", "cu132"),
        ("rtx4090.nvidia-smi", "cu132"),
        ("v100.nvidia-smi", "cu126"),  # Volta: cu128 dropped it in 2.11, cu130 never had it
        ("p100.nvidia-smi", "cu126"),
    ],
)
def test_auto_pick_per_gpu(stack, gpu, rows, smi, variant):
    chosen = pick(stack, rows, [host(gpu, smi=smi)])
    assert chosen["problems"] == {}
    assert (chosen["row"]["torch"], chosen["row"]["variant"]) == ("2.14.1", variant)


def test_auto_pick_takes_the_oldest_gpu_into_account(stack, gpu, rows):
    hosts = [host(gpu, "n1", smi="h100-8x.nvidia-smi"), host(gpu, "n2", smi="p100.nvidia-smi")]
    assert pick(stack, rows, hosts)["row"]["variant"] == "cu126"


def test_cpu_only_cluster_gets_cpu_build(stack, gpu, rows):
    hosts = [host(gpu, "n1", group="cpu"), host(gpu, "n2", group="cpu")]
    chosen = pick(stack, rows, hosts)
    assert chosen["row"]["variant"] == "cpu"
    assert chosen["profiles"] == {"n1": "cpu", "n2": "cpu"}


def test_pinned_cuda_build_on_cpu_hosts(stack, gpu, rows):
    chosen = pick(stack, rows, [host(gpu, group="cpu")], torch="2.14.1", variant="cu130")
    assert chosen["row"]["variant"] == "cu130"
    assert chosen["profiles"] == {"node1": "cpu"}


def test_pinned_torch_only(stack, gpu, rows):
    chosen = pick(stack, rows, [host(gpu, smi="h100-8x.nvidia-smi")], torch="2.7.1")
    assert (chosen["row"]["torch"], chosen["row"]["variant"]) == ("2.7.1", "cu128")


def test_the_real_h200_gets_the_row_it_ran(stack, gpu, rows):
    # The H200 that ran the trainer (2026-12-04): Ubuntu 24.04, driver 580.159.04, torch
    # 2.11.0+cu130 installed. Asked for that build, with the driver managed or frozen,
    # preflight picks the row of what the machine really runs.
    for manage in (True, False):
        h = host(gpu, smi="h200.nvidia-smi", os="ubuntu2404", os_name="Ubuntu 24.04.3 LTS",
                 manage_driver=manage)
        chosen = pick(stack, rows, [h], torch="2.11.0", variant="cu130")
        assert chosen["problems"] == {}, chosen
        assert (chosen["row"]["torch"], chosen["row"]["torchvision"], chosen["row"]["cuda"]) == (
            "2.11.0", "0.26.0", "13.0")
        assert chosen["profiles"] == {"node1": "gpu"}


def test_driver_frozen_picks_what_the_installed_driver_runs(stack, gpu, rows):
    # Driver 570 installed and not to be touched: cu132 (595) and cu130 (580) are out;
    # 2.14 has no cu128 build (PyTorch dropped it after 2.11), so cu126 (560.28) it is.
    # Before, the matrix listed a 2.14.1 cu128 row, and pip found no such wheel.
    h = host(gpu, smi="a100-4x.nvidia-smi", manage_driver=False)
    chosen = pick(stack, rows, [h])["row"]
    assert (chosen["torch"], chosen["variant"]) == ("2.14.1", "cu126")


def test_branch_cap(stack, gpu, rows):
    h = host(gpu, smi="h100-8x.nvidia-smi", driver_branch_max="570")
    assert pick(stack, rows, [h])["row"]["variant"] == "cu126"
    h = host(gpu, smi="h100-8x.nvidia-smi", driver_branch_max="580")
    assert pick(stack, rows, [h])["row"]["variant"] == "cu130"


# ------------------------------------------------------------ failures


def only_problem(chosen, name="node1"):
    assert chosen["row"] is None
    return " ".join(chosen["problems"][name])


def test_gpu_too_old_for_pinned_variant(stack, gpu, rows):
    msg = only_problem(pick(stack, rows, [host(gpu, smi="p100.nvidia-smi")], torch="2.14.1", variant="cu130"))
    assert msg.startswith("node1: GPU 0 (Tesla P100-PCIE-16GB, PCI 00000000:00:04.0) has compute capability 6.0")
    assert "too old for torch 2.14.1 cu130, which is built for 7.5, 8.0" in msg
    assert "Needs: a variant built for 6.0" in msg


def test_driver_too_old_while_frozen(stack, gpu, rows):
    h = host(gpu, smi="h100-old-driver.nvidia-smi", manage_driver=False)
    msg = only_problem(pick(stack, rows, [h], torch="2.14.1", variant="cu130"))
    assert "node1: NVIDIA driver 535.183.01 is installed and driver changes are disabled" in msg
    assert "needs driver 580.65.06 or newer" in msg


def test_no_driver_while_frozen(stack, gpu, rows):
    h = host(gpu, smi="h100-8x.nvidia-smi", manage_driver=False, driver_version=None)
    msg = only_problem(pick(stack, rows, [h], torch="2.14.1", variant="cu130"))
    assert "no NVIDIA driver is installed and driver changes are disabled" in msg


def test_driver_too_old_is_fine_when_managed(stack, gpu, rows):
    h = host(gpu, smi="h100-old-driver.nvidia-smi")
    assert pick(stack, rows, [h], torch="2.14.1", variant="cu130")["problems"] == {}


def test_secure_boot_without_signing(stack, gpu, rows):
    h = host(gpu, smi="h100-old-driver.nvidia-smi", secure_boot=True)
    msg = only_problem(pick(stack, rows, [h], variant="cu130", torch="2.14.1"))
    assert "node1: Secure Boot is on and no DKMS signing key was found" in msg
    h["signing_key"] = "/var/lib/dkms/mok.pub"
    msg = only_problem(pick(stack, rows, [h], variant="cu130", torch="2.14.1"))
    assert "the key /var/lib/dkms/mok.pub is not enrolled" in msg
    h["signing_key_enrolled"] = True
    assert pick(stack, rows, [h], variant="cu130", torch="2.14.1")["problems"] == {}


def test_secure_boot_with_the_right_driver_in_place(stack, gpu, rows):
    # The 580 driver is already there and loaded, and the plan keeps it (policy
    # stack: the cu130 row's 580 at the catalogue's 580.95.05): nothing new needs signing.
    h = host(gpu, smi="h100-8x.nvidia-smi", secure_boot=True)
    h["driver_plan"]["policy"] = "stack"
    assert pick(stack, rows, [h], variant="cu130", torch="2.14.1")["problems"] == {}


def sb_problem(stack, rows, h, **kw):
    problems = pick(stack, rows, [h], **kw)["problems"]
    return " ".join(problems.get(h["name"], []))


def test_secure_boot_guard_asks_the_policys_branch_not_the_rows(stack, gpu, rows):
    # A V100 (7.0) on the cu126 row's own driver 560.35.05. The row says 560,
    # but the supported policy installs 580 (620 and 595 start at Turing): the
    # module is replaced. a46a43a compared 560 with the row's 560 and let it through.
    h = host(gpu, smi="v100.nvidia-smi", secure_boot=True, driver_version="560.35.05")
    msg = sb_problem(stack, rows, h, torch="2.14.1", variant="cu126")
    assert (
        "node1: Secure Boot is on and no DKMS signing key was found; for torch 2.14.1 cu126 driver 560.35.05 "
        "would be replaced by branch 580 (newest long-term branch supporting every GPU in the cluster)"
    ) in msg
    assert "Needs: a DKMS signing key enrolled with `mokutil --import`" in msg
    # The same host already on 580: the plan keeps it, nothing to sign (a46a43a
    # refused it, 580 not being the row's 560).
    h["driver_version"] = "580.95.05"
    assert sb_problem(stack, rows, h, torch="2.14.1", variant="cu126") == ""
    # Policy stack does take the row's 560: then the 580 host keeps its newer
    # branch (no downgrade) and the 560 host keeps 560.
    h["driver_plan"]["policy"] = "stack"
    assert sb_problem(stack, rows, h, torch="2.14.1", variant="cu126") == ""
    h["driver_version"] = "560.35.05"
    assert sb_problem(stack, rows, h, torch="2.14.1", variant="cu126") == ""


def test_secure_boot_guard_follows_the_cluster_policy_to_a_new_branch(stack, gpu, rows):
    # H100s on 580 with the default policy: supported picks the newest long-term
    # branch for Hopper (620), so the cu130 row (driver_branch 580) still means a new module.
    h = host(gpu, smi="h100-8x.nvidia-smi", secure_boot=True)
    msg = sb_problem(stack, rows, h, torch="2.14.1", variant="cu130")
    assert "for torch 2.14.1 cu130 driver 580.95.05 would be replaced by branch 620" in msg
    # An older GPU elsewhere in the cluster keeps every host on a branch that runs it (580).
    other = host(gpu, "node2", smi="v100.nvidia-smi", driver_version="580.95.05")
    assert pick(stack, rows, [h, other], torch="2.14.1", variant="cu126")["problems"] == {}


def test_secure_boot_guard_counts_a_point_upgrade(stack, gpu, rows):
    # H100 on 580.65.06, the cu130 row and policy stack: same branch as the
    # row (a46a43a saw no change), but the plan brings 580 to its newest point
    # release (at least the catalogue's 580.95.05): DKMS builds a new module.
    h = host(gpu, smi="h100-8x.nvidia-smi", secure_boot=True, driver_version="580.65.06")
    h["driver_plan"]["policy"] = "stack"
    msg = sb_problem(stack, rows, h, torch="2.14.1", variant="cu130")
    assert (
        "node1: Secure Boot is on and no DKMS signing key was found; for torch 2.14.1 cu130 driver 580.65.06 "
        "would be upgraded to the newest point release of branch 580"
    ) in msg
    h["signing_key"], h["signing_key_enrolled"] = "/var/lib/dkms/mok.pub", True
    assert sb_problem(stack, rows, h, torch="2.14.1", variant="cu130") == ""


def test_secure_boot_guard_counts_nvidia_driver_update(stack, gpu, rows):
    # On the catalogue's 580.95.05 nothing changes, until nvidia_driver_update
    # asks for the branch's newest point release: a new module again.
    h = host(gpu, smi="h100-8x.nvidia-smi", secure_boot=True, signing_key="/var/lib/dkms/mok.pub")
    h["driver_plan"].update(policy="stack")
    assert sb_problem(stack, rows, h, torch="2.14.1", variant="cu130") == ""
    h["driver_plan"]["update"] = True
    msg = sb_problem(stack, rows, h, torch="2.14.1", variant="cu130")
    assert (
        "node1: Secure Boot is on and the key /var/lib/dkms/mok.pub is not enrolled; for torch 2.14.1 cu130 "
        "driver 580.95.05 would be upgraded to the newest point release of branch 580 (nvidia_driver_update)"
    ) in msg
    # A version named by hand and already installed: update changes nothing.
    h["driver_plan"].update(branch="580", version="580.95.05-1")
    assert sb_problem(stack, rows, h, torch="2.14.1", variant="cu130") == ""


def test_gpu_group_without_gpu(stack, gpu, rows):
    h = host(gpu, gpu_notes=["neither a working nvidia-smi nor lspci (package pciutils) was found"])
    msg = only_problem(pick(stack, rows, [h]))
    assert "node1 is in the group gpu_nodes but no NVIDIA GPU was found (neither a working nvidia-smi" in msg


def test_unsupported_os(stack, gpu, rows):
    h = host(gpu, group="cpu", os="debian11", os_name="Debian 11.9")
    msg = only_problem(pick(stack, rows, [h], torch="2.14.1", variant="cpu"))
    assert "node1 runs Debian 11.9 (debian11); torch 2.14.1 cpu supports debian12, ubuntu2204, ubuntu2404" in msg


def test_not_enough_disk(stack, gpu, rows):
    h = host(gpu, group="cpu", free_bytes=3 * GIB)
    msg = only_problem(pick(stack, rows, [h]))
    assert "node1: only 3.0 GiB free on the file system of /opt. Needs: at least 10 GiB" in msg


def test_unknown_torch_and_variant(stack, gpu, rows):
    msg = only_problem(pick(stack, rows, [host(gpu, group="cpu")], torch="9.9.9", variant="cu999"))
    assert "node1: no row of the compatibility matrix matches torchrig_torch=9.9.9 torchrig_variant=cu999" in msg
    assert "2.14.1: cu132, cu130, cu126, cpu" in msg


def test_unknown_cc_on_gpu_host(stack, gpu, rows):
    g = gpu.parse_lspci("01:00.0 3D controller [0302]: NVIDIA Corporation Device [10de:ffff] (rev a1)\n")
    h = host(gpu, gpus=g, gpu_count=1)
    assert "has an unknown compute capability" in only_problem(pick(stack, rows, [h]))


def test_no_common_row_names_every_host(stack, gpu, rows):
    # One host's frozen driver 535 allows only CUDA 11.8; the other's Secure Boot
    # rules out any driver change. No row fits both.
    hosts = [
        # Ubuntu 22.04: NVIDIA's debian12 repository has no CUDA 11.8.
        host(gpu, "n1", smi="h100-old-driver.nvidia-smi", manage_driver=False, os="ubuntu2204", os_name="Ubuntu 22.04"),
        host(gpu, "n2", smi="a100-4x.nvidia-smi", secure_boot=True, os="ubuntu2204", os_name="Ubuntu 22.04"),
    ]
    chosen = pick(stack, rows, hosts)
    assert chosen["row"] is None
    assert set(chosen["problems"]) == {"n1", "n2"}
    assert "n1 would accept torch 2.7.1 cu118, torch 2.6.0 cu118" in " ".join(chosen["problems"]["n1"])


# ------------------------------------------------------------ the node's Python
# torch publishes wheels for some CPython versions only (torch_python in the
# matrix); a node whose /usr/bin/python3 is not one of them gets no torch from pip.

PY_MATRIX = """
torch_python:
  "2.15": ["3.11", "3.12", "3.13", "3.14", "3.15"]
  "2.14": ["3.10", "3.11", "3.12", "3.13", "3.14", "3.15"]
rows:
  - {torch: "2.15.0", torchvision: "0.30.0", variant: cpu, compute_capabilities: [], os: [ubuntu2204, ubuntu2404]}
  - {torch: "2.14.1", torchvision: "0.29.1", variant: cpu, compute_capabilities: [], os: [ubuntu2204, ubuntu2404]}
"""


def test_rows_carry_their_releases_python_versions(stack, rows):
    for r in rows:
        assert r["python"], r
    r = next(r for r in rows if (r["torch"], r["variant"]) == ("2.14.1", "cu130"))
    assert r["python"][0] == "3.10"


def test_python_without_wheels_is_refused_naming_host_python_and_what_is_needed(stack, gpu):
    rows = stack.load_matrix(PY_MATRIX)["rows"]
    jammy = host(gpu, group="cpu", os="ubuntu2204", os_name="Ubuntu 22.04.5 LTS", python="3.10",
                 python_path="/usr/bin/python3")
    msg = only_problem(pick(stack, rows, [jammy], torch="2.15.0"))
    assert msg.startswith("node1: its /usr/bin/python3 is Python 3.10 (Ubuntu 22.04.5 LTS); torch 2.15.0 cpu has "
                          "wheels for Python 3.11, 3.12, 3.13, 3.14, 3.15 only")
    assert "Needs: a host whose /usr/bin/python3 is one of those" in msg
    # Not pinned: the newest torch that has wheels for its Python.
    assert pick(stack, rows, [jammy])["row"]["torch"] == "2.14.1"
    noble = dict(jammy, os="ubuntu2404", python="3.12")
    assert pick(stack, rows, [noble])["row"]["torch"] == "2.15.0"


def test_unknown_python_is_not_judged(stack, gpu):
    # A host whose python3 did not answer: the venv step reports it instead.
    rows = stack.load_matrix(PY_MATRIX)["rows"]
    h = host(gpu, group="cpu", os="ubuntu2204", python=None)
    assert pick(stack, rows, [h], torch="2.15.0")["problems"] == {}


@pytest.mark.parametrize(
    "text,needle",
    [
        (PY_MATRIX.split("rows:")[0].replace('  "2.15"', '  "2.13"') + "rows:" + PY_MATRIX.split("rows:")[1],
         'torch_python has no entry for torch 2.15 (expected a key "2.15"'),
        ("rows:" + PY_MATRIX.split("rows:")[1], "m.yml lacks torch_python: expected a mapping of torch releases"),
        (PY_MATRIX.replace('["3.11", "3.12"', '[3.11, "3.12"'), "torch_python '2.15' must list quoted Python versions"),
    ],
)
def test_malformed_torch_python(stack, text, needle):
    loaded = stack.load_matrix(text, "m.yml")
    assert loaded["rows"] == []
    assert any(needle in e for e in loaded["errors"]), loaded["errors"]
