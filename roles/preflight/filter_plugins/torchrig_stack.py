"""The compatibility matrix: load and check it, judge hosts against its rows,
pick the row for the cluster. Plain functions (unit-tested in tests/), exposed
to the preflight role as filters."""

from __future__ import annotations

import re

import yaml

# The nvidia_driver role's plan (one copy, in the collection): the Secure Boot guard asks
# it which driver a host ends up with instead of deciding a second time.
from ansible_collections.torchrig.cluster.plugins.module_utils import torchrig_driver as driver_plan

REQUIRED_KEYS = ("torch", "torchvision", "variant", "compute_capabilities", "os")
GPU_KEYS = (
    "cuda",
    "cuda_toolkit_package",
    "cuda_toolkit_version",
    "cudnn_package",
    "cudnn_version",
    "min_driver",
    "driver_branch",
    "driver_version",
)
OPTIONAL_KEYS = ("index_url",)
STRING_KEYS = ("torch", "torchvision", "variant") + GPU_KEYS
VERSION_RE = re.compile(r"^\d+(\.\d+)+$")
CC_RE = re.compile(r"^\d+\.\d+$")
GIB = 1024**3
def version_tuple(text):
    return tuple(int(p) for p in re.findall(r"\d+", str(text)))


def label(row):
    return "torch {} {}".format(row.get("torch"), row.get("variant"))


# ---------------------------------------------------------------- the matrix


def _row_errors(i, row):
    where = f"row {i + 1}"
    if not isinstance(row, dict):
        return [f"{where} is not a mapping of keys to values (got {row!r})"]
    where = f"row {i + 1} ({label(row)})"
    errors = []
    gpu = row.get("variant") != "cpu"
    required = REQUIRED_KEYS + (GPU_KEYS if gpu else ())
    for key in required:
        if key not in row:
            errors.append(f"{where} lacks the key {key}")
    known = REQUIRED_KEYS + GPU_KEYS + OPTIONAL_KEYS
    for key in row:
        if key not in known:
            errors.append("{} has an unknown key {} (known: {})".format(where, key, ", ".join(known)))
    for key in STRING_KEYS:
        if key in row and not isinstance(row[key], str):
            errors.append(
                f"{where}: {key} must be a quoted string, got {row[key]!r} (YAML reads 2.10 as the number 2.1)"
            )
    for key in ("torch", "torchvision", "min_driver", "cuda"):
        if isinstance(row.get(key), str) and not VERSION_RE.match(row[key]):
            errors.append(f"{where}: {key} {row[key]!r} is not a version like 2.14.1")
    ccs = row.get("compute_capabilities")
    if "compute_capabilities" in row:
        if not isinstance(ccs, list) or not all(isinstance(c, str) and CC_RE.match(c) for c in ccs):
            errors.append(f'{where}: compute_capabilities must be a list of quoted "M.m" strings, got {ccs!r}')
        elif gpu and not ccs:
            errors.append("{}: a {} build lists no compute capabilities".format(where, row.get("variant")))
    oses = row.get("os")
    if "os" in row and (not isinstance(oses, list) or not oses or not all(isinstance(o, str) for o in oses)):
        errors.append(f"{where}: os must be a non-empty list like [debian12, ubuntu2404], got {oses!r}")
    branch, min_driver = row.get("driver_branch"), row.get("min_driver")
    if isinstance(branch, str) and isinstance(min_driver, str) and min_driver.split(".")[0] != branch:
        errors.append(f"{where}: min_driver {min_driver} is not on driver_branch {branch}")
    return errors


def load_matrix(text, source="compat_matrix.yml"):
    """Parse and check the matrix file; returns {'rows': [...], 'errors': [...], 'driver_branches': [...]}."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        return {"rows": [], "errors": [f"{source} is not valid YAML{where}: {problem}"], "driver_branches": []}
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or not data["rows"]:
        return {"rows": [], "errors": [f"{source} must be a mapping with a non-empty list under the key rows"],
                "driver_branches": []}
    errors = []
    seen = set()
    pythons, python_errors = _torch_python(data.get("torch_python"), source)
    errors += python_errors
    rows = []
    for i, row in enumerate(data["rows"]):
        errors += [f"{source}: {e}" for e in _row_errors(i, row)]
        if isinstance(row, dict):
            key = (row.get("torch"), row.get("variant"))
            if key in seen:
                errors.append(f"{source}: row {i + 1} repeats {label(row)}")
            seen.add(key)
            release = torch_release(row.get("torch"))
            if pythons is not None and release not in pythons:
                errors.append(
                    f"{source}: row {i + 1} ({label(row)}): torch_python has no entry for torch {release} "
                    f'(expected a key "{release}" listing the Python versions PyTorch publishes wheels for)'
                )
            # Each row carries its release's Python versions: row_problems judges a host by the row alone.
            rows.append({**row, "python": (pythons or {}).get(release, [])})
    branches = data.get("driver_branches") or []
    return {"rows": rows if not errors else [], "errors": errors, "driver_branches": branches if not errors else []}


def torch_release(version):
    """'2.14.1' -> '2.14': PyTorch states Python support per minor release."""
    return ".".join(str(version).split(".")[:2])


def _torch_python(data, source):
    """The torch_python mapping (release -> ["3.10", ...]), checked; None when missing."""
    expected = 'a mapping of torch releases to Python versions, like torch_python: {"2.14": ["3.10", "3.11"]}'
    if not isinstance(data, dict) or not data:
        return None, [f"{source} lacks torch_python: expected {expected}"]
    errors = []
    for release, versions in data.items():
        if not isinstance(release, str) or not re.match(r"^\d+\.\d+$", release):
            errors.append(f"{source}: torch_python key {release!r} must be a quoted release like \"2.14\"")
        if not isinstance(versions, list) or not versions or not all(
            isinstance(v, str) and re.match(r"^3\.\d+$", v) for v in versions
        ):
            errors.append(
                f'{source}: torch_python {release!r} must list quoted Python versions like ["3.10", "3.11"], '
                f"got {versions!r}"
            )
    return data, errors


# ---------------------------------------------------------------- the hosts


def os_id(distribution, version):
    """('Debian', '12.8') -> 'debian12'; ('Ubuntu', '22.04') -> 'ubuntu2204'."""
    distribution = str(distribution).lower()
    parts = str(version).split(".")
    if distribution == "ubuntu":
        return "ubuntu" + "".join(parts[:2])
    return distribution + parts[0]


def cc_supported(cc, built):
    """A GPU of capability M.m runs code built for M.k, k <= m (same major only)."""
    major, minor = version_tuple(cc)[:2]
    return any(version_tuple(b)[0] == major and version_tuple(b)[1] <= minor for b in built)


def profile(host):
    """gpu or cpu. Inventory groups decide; a host in neither group goes by what it has."""
    if host.get("gpu_group"):
        return "gpu"
    if host.get("cpu_group"):
        return "cpu"
    return "gpu" if host.get("gpu_count", 0) > 0 else "cpu"


def _gpu_label(gpu):
    return "GPU {} ({}, PCI {})".format(gpu.get("index"), gpu.get("name"), gpu.get("pci_bus_id"))


def host_only_problems(host):
    name = host["name"]
    problems = []
    if host.get("gpu_group") and host.get("gpu_count", 0) == 0:
        notes = "; ".join(host.get("gpu_notes") or []) or "lspci lists no NVIDIA display or 3D controller"
        problems.append(
            f"{name} is in the group gpu_nodes but no NVIDIA GPU was found ({notes}). Needs: a GPU the host can see "
            "(check the PCI passthrough or instance type), or move the host to cpu_nodes."
        )
    if profile(host) == "gpu":
        for gpu in host.get("gpus") or []:
            if not gpu.get("compute_capability"):
                problems.append(
                    f"{name}: {_gpu_label(gpu)} has an unknown compute capability (nvidia-smi did not run and "
                    "lspci's chip name is not in preflight's table). Needs: a working NVIDIA driver, so nvidia-smi "
                    "can report it."
                )
    free, need = host.get("free_bytes"), host.get("min_free_gib")
    if free is not None and need is not None and free < need * GIB:
        problems.append(
            f"{name}: only {free / GIB:.1f} GiB free on the file system of {host.get('disk_path')}. Needs: at least "
            f"{need} GiB (preflight_min_free_gib) for the venv, the wheels and the CUDA packages."
        )
    return problems


def _flag(value):
    return value is True or str(value).strip().lower() in ("true", "yes", "1", "on")


def module_change(host, row, cluster_ccs=()):
    """Why the nvidia_driver role would rebuild or replace this host's nvidia
    kernel module for this row ('': it would not), asked of the role's own
    plan (torchrig_driver.driver_decision) with the role's settings
    (host['driver_plan']: policy, branches, branch, version, branch_max,
    update, downgrade, kernel_modules) and the running driver. Any change
    counts: another branch (the policy's, which need not be the row's
    driver_branch), another point release (nvidia_driver_update's included),
    a first install."""
    drv = driver_plan
    settings = host.get("driver_plan") or {}
    gpus = host.get("gpus") or []
    host_ccs = sorted({g["compute_capability"] for g in gpus if g.get("compute_capability")})
    branch_max = settings.get("branch_max", host.get("driver_branch_max"))
    try:
        if not settings.get("branches"):
            raise drv.PlanError("no driver_branches were given to preflight (driver_plan.branches)")
        decision = drv.driver_decision(
            catalogue=settings["branches"],
            policy=settings.get("policy") or "supported",
            floor=row["min_driver"],
            host_ccs=host_ccs,
            cluster_ccs=list(cluster_ccs) or host_ccs,
            gpu_names=[g.get("name") or "" for g in gpus],
            have=drv.running_driver(host.get("driver_version")),
            kernel_modules_override=settings.get("kernel_modules") or "auto",
            branch_max=str(branch_max or ""),
            branch=str(settings.get("branch") or ""),
            version=str(settings.get("version") or ""),
            stack={"branch": row["driver_branch"], "version": row["driver_version"]},
            downgrade=_flag(settings.get("downgrade")),
            update=_flag(settings.get("update")),
        )
    except drv.PlanError as e:
        # The role would stop on this too; until it can say, a change is assumed.
        return f"the nvidia_driver plan cannot tell which driver it installs ({e}), so a new one is assumed"
    return decision["module_change"]


def row_problems(row, host, cluster_ccs=()):
    """Why this host cannot take this row (empty: it can). cluster_ccs: every
    GPU of the cluster (the driver policy's branch must run them all)."""
    name = host["name"]
    problems = []
    if host.get("os") not in row["os"]:
        problems.append(
            "{} runs {} ({}); {} supports {}. Needs: one of those releases.".format(
                name, host.get("os_name"), host.get("os"), label(row), ", ".join(row["os"])
            )
        )
    python = host.get("python")
    if python and row.get("python") and python not in row["python"]:
        problems.append(
            "{}: its {} is Python {} ({}); {} has wheels for Python {} only, so pip would find no torch to install. "
            "Needs: a host whose {} is one of those (another OS release), or a torch release built for "
            "Python {}.".format(
                name, host.get("python_path") or "python3", python, host.get("os_name"), label(row),
                ", ".join(row["python"]), host.get("python_path") or "python3", python,
            )
        )
    if profile(host) != "gpu" or row["variant"] == "cpu":
        return problems
    built = row["compute_capabilities"]
    for gpu in host.get("gpus") or []:
        cc = gpu.get("compute_capability")
        if cc and not cc_supported(cc, built):
            problems.append(
                "{}: {} has compute capability {}, too old for {}, which is built for {}. Needs: a variant built "
                "for {} (the matrix's cu126 rows reach back to 5.0) or a newer GPU.".format(
                    name, _gpu_label(gpu), cc, label(row), ", ".join(built), cc
                )
            )
    installed = host.get("driver_version")
    if not host.get("manage_driver", True):
        if not installed:
            problems.append(
                "{}: no NVIDIA driver is installed and driver changes are disabled (nvidia_driver_manage: false). "
                "Needs: driver {} or newer for {}, installed by you, or nvidia_driver_manage: true.".format(
                    name, row["min_driver"], label(row)
                )
            )
        elif version_tuple(installed) < version_tuple(row["min_driver"]):
            problems.append(
                "{}: NVIDIA driver {} is installed and driver changes are disabled (nvidia_driver_manage: false); "
                "{} (CUDA {}) needs driver {} or newer. Needs: a newer driver, nvidia_driver_manage: true, or an "
                "older variant.".format(name, installed, label(row), row["cuda"], row["min_driver"])
            )
    else:
        branch_max = host.get("driver_branch_max")
        if branch_max and int(row["driver_branch"]) > int(branch_max):
            problems.append(
                "{}: {} needs driver branch {}; preflight_driver_branch_max allows {} at most.".format(
                    name, label(row), row["driver_branch"], branch_max
                )
            )
        signing_ready = host.get("signing_key") and host.get("signing_key_enrolled")
        change = module_change(host, row, cluster_ccs) if host.get("secure_boot") and not signing_ready else ""
        if change:
            key = host.get("signing_key")
            found = (f"the key {key} is not enrolled") if key else "no DKMS signing key was found"
            problems.append(
                f"{name}: Secure Boot is on and {found}; for {label(row)} {change}, and the newly DKMS-built "
                "nvidia modules would not load. Needs: a DKMS signing key enrolled with `mokutil --import` (then "
                "a reboot to confirm it), or Secure Boot off."
            )
    return problems


def host_problems(row, host, cluster_ccs=()):
    return host_only_problems(host) + row_problems(row, host, cluster_ccs)


def cluster_compute_capabilities(hosts):
    """Every GPU's compute capability on every host, as the nvidia_driver role
    gives its plan (nvidia_driver_cluster_compute_capabilities)."""
    return sorted({g["compute_capability"] for h in hosts for g in h.get("gpus") or [] if g.get("compute_capability")})


# ---------------------------------------------------------------- the choice


def _order(rows, cpu_first):
    def key(row):
        gpu_rank = 0 if row["variant"] == "cpu" else 1
        if cpu_first:
            gpu_rank = -gpu_rank
        return (version_tuple(row["torch"]), gpu_rank, version_tuple(row.get("cuda") or "0"))

    return sorted(rows, key=key, reverse=True)


def select_stack(rows, hosts, torch=None, variant=None):
    """Pick one row for all hosts: the user's (torch and/or variant), else the
    newest torch, then the newest CUDA every host can take. Without any GPU host
    the cpu build comes first; with one, cpu builds are only taken when asked for.

    Returns {'row': row or None, 'problems': {host: [messages]}, 'profiles': {host: gpu|cpu}}.
    """
    profiles = {h["name"]: profile(h) for h in hosts}
    ccs = cluster_compute_capabilities(hosts)
    any_gpu = "gpu" in profiles.values()
    torch = str(torch) if torch else None
    cands = [r for r in rows if (not torch or r["torch"] == torch) and (not variant or r["variant"] == variant)]
    if not cands:
        known = {}
        for r in rows:
            known.setdefault(r["torch"], []).append(r["variant"])
        asked = "torchrig_torch={} torchrig_variant={}".format(torch or "(any)", variant or "(any)")
        listing = "; ".join("{}: {}".format(t, ", ".join(v)) for t, v in known.items())
        msg = "%s: no row of the compatibility matrix matches %s. Needs: one of %s."
        return {
            "row": None,
            "problems": {h["name"]: [msg % (h["name"], asked, listing)] for h in hosts},
            "profiles": profiles,
        }
    if not variant and any_gpu:
        cands = [r for r in cands if r["variant"] != "cpu"] or cands
    cands = _order(cands, cpu_first=not any_gpu)

    for row in cands:
        if not any(host_problems(row, h, ccs) for h in hosts):
            return {"row": row, "problems": {}, "profiles": profiles}

    problems = {}
    preferred = cands[0]
    for h in hosts:
        accepts = [label(r) for r in cands if not host_problems(r, h, ccs)]
        p = host_problems(preferred, h, ccs)
        if p:
            if accepts and len(cands) > 1:
                p = p + ["{} would accept {}.".format(h["name"], ", ".join(accepts))]
            problems[h["name"]] = p
        else:
            problems[h["name"]] = [
                "{}: no row of the matrix fits every host; this host accepts {}. See the other hosts' messages.".format(
                    h["name"], ", ".join(accepts)
                )
            ]
    return {"row": None, "problems": problems, "profiles": profiles}


class FilterModule:
    def filters(self):
        return {
            "torchrig_load_matrix": load_matrix,
            "torchrig_os_id": os_id,
            "torchrig_select_stack": select_stack,
        }
