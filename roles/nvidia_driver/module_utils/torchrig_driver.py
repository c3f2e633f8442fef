"""The driver plan: which NVIDIA driver branch, kernel modules and fabric
packages a host gets, and whether its NVSwitch fabric is up.

Pure functions over facts and command output, so they are unit-tested on
recorded output (tests/test_driver_plan.py) and used by the nvidia_driver_plan
and nvidia_fabric_facts modules on the hosts.
"""

from __future__ import annotations

import re

NVIDIA_VENDOR = "10de"
# NVSwitch chips show in lspci as NVIDIA "Bridge [0680]" functions (HGX/DGX
# A100, H100, H200 boards). GPUs are 0300/0302; the RTX audio function is 0403.
NVSWITCH_PCI_CLASS = "0680"

# Branch kinds from NVIDIA's data-centre driver lifecycle: long_term (LTSB,
# about three years of fixes), production (PB, about one year), new_feature
# (NFB, a few months, then no security fixes).
BRANCH_KINDS = ("long_term", "production", "new_feature")
# nvidia_driver_branch_policy -> the kinds it may choose; "stack" takes the
# matrix row's own branch.
POLICY_KINDS = {
    "supported": ("long_term", "production"),
    "long_term": ("long_term",),
}
POLICIES = tuple(POLICY_KINDS) + ("stack",)

# From R580, NVIDIA's CUDA repository names the fabric packages without the
# branch (version = driver version); before, with it (nvidia-fabricmanager-570).
UNVERSIONED_FABRIC_NAMES_FROM = 580

# The kernel module package of either flavour, on Debian and Ubuntu, in
# NVIDIA's repository: the installed driver's version and flavour are read
# from it (the meta packages differ between distributions and flavours).
_DKMS_PACKAGE = re.compile(r"^(nvidia-kernel-(open-)?dkms|nvidia-dkms-(\d+)(-open)?)$")

_FABRIC_PACKAGE = re.compile(r"^(nvidia-fabricmanager|libnvidia-nscq|libnvsdm)(-\d+)?$")

# "07:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)"
_LSPCI_LINE = re.compile(
    r"^(?P<slot>\S+) (?P<cls_name>.+?) \[(?P<cls>[0-9a-f]{4})\]: (?P<desc>.+?) "
    r"\[(?P<vendor>[0-9a-f]{4}):(?P<device>[0-9a-f]{4})\](?: \(rev [0-9a-f]+\))?$"
)


class PlanError(ValueError):
    """Input the plan cannot work with; the message names it and what is expected."""


def version_tuple(text):
    """'580.95.05-1' -> (580, 95, 5); '1:570.26-0ubuntu1' -> (570, 26)."""
    upstream = upstream_version(text)
    if not re.match(r"^\d+(\.\d+)*$", upstream):
        raise PlanError(f"{text!r} is not a driver version (expected digits and dots, e.g. 580.95.05 or 580.95.05-1)")
    return tuple(int(p) for p in upstream.split("."))


def upstream_version(text):
    """Package version -> upstream part: '1:580.95.05-0ubuntu1' -> '580.95.05'."""
    text = str(text).strip()
    text = text.split(":", 1)[1] if ":" in text else text
    return text.split("-", 1)[0]


def cc_tuple(cc):
    try:
        major, minor = str(cc).split(".")
        return int(major), int(minor)
    except ValueError:
        raise PlanError(f"compute capability {cc!r} is not MAJOR.MINOR (e.g. 9.0)") from None


# ---------------------------------------------------------------- hardware


def parse_nvswitches(text):
    """NVSwitch chips from `lspci -nn`: NVIDIA (10de) functions of class 0680."""
    switches = []
    for line in text.splitlines():
        m = _LSPCI_LINE.match(line.strip())
        if m and m.group("vendor") == NVIDIA_VENDOR and m.group("cls") == NVSWITCH_PCI_CLASS:
            switches.append({"pci_bus_id": m.group("slot"), "pci_device_id": f"{NVIDIA_VENDOR}:{m.group('device')}"})
    return switches


def is_blackwell(ccs):
    """Data-centre Blackwell (B200, GB200, B300): compute capability 10.x."""
    return any(cc_tuple(c)[0] == 10 for c in ccs)


def kernel_modules(ccs, gpu_names=(), override="auto"):
    """('open' | 'proprietary', why). Grace Hopper and Blackwell run only the
    open modules; Maxwell, Pascal and Volta (below 7.5: no GSP) only the
    proprietary ones; Turing to Hopper run both, and NVIDIA's default there
    since R560 is open. A mix with one older GPU takes proprietary."""
    need_open = sorted({c for c in ccs if cc_tuple(c)[0] >= 10})
    need_open += sorted({n for n in gpu_names if "GH200" in n or "GB200" in n})
    need_proprietary = sorted({c for c in ccs if cc_tuple(c) < (7, 5)})
    if need_open and need_proprietary:
        raise PlanError(
            "GPUs {} need NVIDIA's open kernel modules and GPUs {} the proprietary ones; one host cannot load "
            "both. Expected: GPUs of one kind per host.".format(", ".join(need_open), ", ".join(need_proprietary))
        )
    if override not in ("auto", "open", "proprietary"):
        raise PlanError(f"nvidia_driver_kernel_modules is {override!r}; expected auto, open or proprietary")
    if override == "open" and need_proprietary:
        raise PlanError(
            "nvidia_driver_kernel_modules is open, but compute capability {} (Maxwell, Pascal, Volta) runs only "
            "the proprietary modules. Expected: auto or proprietary.".format(", ".join(need_proprietary))
        )
    if override == "proprietary" and need_open:
        raise PlanError(
            "nvidia_driver_kernel_modules is proprietary, but {} (Grace Hopper, Blackwell) runs only the open "
            "modules. Expected: auto or open.".format(", ".join(need_open))
        )
    if override != "auto":
        return override, "nvidia_driver_kernel_modules"
    if need_proprietary:
        return "proprietary", "compute capability {} needs them".format(", ".join(need_proprietary))
    if need_open:
        return "open", "{} needs them".format(", ".join(need_open))
    return "open", "NVIDIA's default for Turing and newer since R560"


# ---------------------------------------------------------------- branches


def check_catalogue(branches):
    """The matrix's driver_branches, checked; returns them sorted newest first."""
    if not isinstance(branches, list) or not branches:
        raise PlanError("driver_branches (compat_matrix.yml) must be a non-empty list")
    for i, b in enumerate(branches):
        where = f"driver_branches entry {i + 1}"
        if not isinstance(b, dict):
            raise PlanError(f"{where} is not a mapping")
        missing = [k for k in ("branch", "kind", "version", "min_cc", "max_cc") if k not in b]
        if missing:
            raise PlanError(f"{where} lacks {', '.join(missing)}")
        if not str(b["branch"]).isdigit():
            raise PlanError(f"{where}: branch {b['branch']!r} is not a number like 580")
        if b["kind"] not in BRANCH_KINDS:
            raise PlanError(f"{where}: kind {b['kind']!r}; expected one of {', '.join(BRANCH_KINDS)}")
        if str(version_tuple(b["version"])[0]) != str(b["branch"]):
            raise PlanError(f"{where}: version {b['version']} is not on branch {b['branch']}")
        cc_tuple(b["min_cc"]), cc_tuple(b["max_cc"])
    return sorted(branches, key=lambda b: int(b["branch"]), reverse=True)


def covers(entry, ccs):
    return all(cc_tuple(entry["min_cc"]) <= cc_tuple(c) <= cc_tuple(entry["max_cc"]) for c in ccs)


def choose_branch(catalogue, policy, floor, cluster_ccs, branch_max="", branch="", version="", stack=None):
    """The branch and package version to install: {'branch', 'version', 'why'}.

    floor is the stack's min_driver: never installed below it. policy
    'supported' takes the newest long-term or production branch that supports
    every GPU of the cluster (cluster_ccs) and is at or above the floor;
    'long_term' only long-term ones; 'stack' the matrix row's own branch
    (stack: {'branch', 'version'}). branch (and version) name one instead."""
    if not floor:
        raise PlanError(
            "no minimum driver (nvidia_driver_min_version) is set: run preflight first, which selects the stack"
        )
    floor_t = version_tuple(floor)
    if branch_max and not str(branch_max).isdigit():
        raise PlanError(f"nvidia_driver_branch_max is {branch_max!r}; expected a branch number like 570, or empty")
    entries = check_catalogue(catalogue)
    by_branch = {str(e["branch"]): e for e in entries}

    if branch:
        branch = str(branch)
        entry = by_branch.get(branch)
        if version:
            if str(version_tuple(version)[0]) != branch:
                raise PlanError(f"nvidia_driver_version {version} is not on nvidia_driver_branch {branch}")
        elif not entry:
            raise PlanError(
                "nvidia_driver_branch {} is not in driver_branches (compat_matrix.yml: {}); expected one of them, "
                "or nvidia_driver_version too".format(branch, ", ".join(by_branch))
            )
        chosen = {"branch": branch, "version": version or entry["version"], "why": "nvidia_driver_branch"}
        if entry and not covers(entry, cluster_ccs):
            raise PlanError(
                f"nvidia_driver_branch {branch} supports compute capability {entry['min_cc']} to {entry['max_cc']}; "
                f"the cluster has {', '.join(cluster_ccs)}. Expected a branch that supports every GPU."
            )
    elif policy == "stack":
        if not stack or not stack.get("branch") or not stack.get("version"):
            raise PlanError("nvidia_driver_branch_policy is stack, but no stack driver_branch/driver_version is set")
        chosen = {"branch": str(stack["branch"]), "version": stack["version"], "why": "the stack's own branch"}
    elif policy in POLICY_KINDS:
        kinds = POLICY_KINDS[policy]
        fits = [
            e
            for e in entries
            if e["kind"] in kinds
            and version_tuple(e["version"]) >= floor_t
            and covers(e, cluster_ccs)
            and (not branch_max or int(e["branch"]) <= int(branch_max))
        ]
        if not fits:
            raise PlanError(
                "no {} branch in driver_branches meets the minimum driver {}{} and supports compute capability {}. "
                "Expected: nvidia_driver_branch_policy stack, or a branch named in nvidia_driver_branch.".format(
                    " or ".join(k.replace("_", "-") for k in kinds),
                    floor,
                    f" within nvidia_driver_branch_max {branch_max}" if branch_max else "",
                    ", ".join(cluster_ccs) or "(none)",
                )
            )
        e = fits[0]
        chosen = {
            "branch": str(e["branch"]),
            "version": e["version"],
            "why": "newest {} branch supporting every GPU in the cluster".format(e["kind"].replace("_", "-")),
        }
    else:
        raise PlanError(f"nvidia_driver_branch_policy is {policy!r}; expected one of {', '.join(POLICIES)}")

    if version_tuple(chosen["version"]) < floor_t:
        raise PlanError(
            f"driver {chosen['version']} (branch {chosen['branch']}, {chosen['why']}) is older than the stack's "
            f"minimum {floor}. Expected a branch at or above it."
        )
    return chosen


# ---------------------------------------------------------------- packages


def installed_driver(installed):
    """{package: version} of installed packages -> the driver's kernel module
    package: {'package', 'version', 'upstream', 'branch', 'flavor'} or None."""
    found = []
    for name, version in installed.items():
        if _DKMS_PACKAGE.match(name):
            upstream = upstream_version(version)
            found.append(
                {
                    "package": name,
                    "version": version,
                    "upstream": upstream,
                    "branch": upstream.split(".")[0],
                    "flavor": "open" if "open" in name else "proprietary",
                }
            )
    return max(found, key=lambda d: version_tuple(d["upstream"])) if found else None


def fabric_packages(branch, blackwell):
    """NVSwitch hosts: Fabric Manager and NSCQ at the driver's version, named
    as NVIDIA's CUDA repository names them for that branch; Blackwell (NVLink
    5) also NVSDM at the driver's version. Returns (versioned, unversioned):
    nvlsm has its own version scheme, so it is not pinned to the driver's."""
    b = int(branch)
    suffix = "" if b >= UNVERSIONED_FABRIC_NAMES_FROM else f"-{b}"
    versioned = [f"nvidia-fabricmanager{suffix}", f"libnvidia-nscq{suffix}"]
    if blackwell:
        versioned.append(f"libnvsdm{suffix}")
    return versioned, (["nvlsm"] if blackwell else [])


def plan(
    *,
    catalogue,
    policy,
    floor,
    host_ccs,
    cluster_ccs,
    gpu_names=(),
    distribution,
    packages_by_os,
    installed=None,
    lspci="",
    kernel_modules_override="auto",
    fabricmanager="auto",
    nvlsm="auto",
    branch_max="",
    branch="",
    version="",
    stack=None,
    downgrade=False,
):
    """Everything the role installs on one GPU host, decided before anything changes."""
    installed = installed or {}
    cluster_ccs = sorted(set(cluster_ccs) | set(host_ccs), key=cc_tuple)
    for name, value in (("nvidia_driver_fabricmanager", fabricmanager), ("nvidia_driver_nvlsm", nvlsm)):
        if value not in ("auto", "always", "never"):
            raise PlanError(f"{name} is {value!r}; expected auto, always or never")
    if distribution not in packages_by_os:
        raise PlanError(
            "no driver packages are named for {} in nvidia_driver_packages_by_os (it has {}); expected an entry "
            "for this distribution".format(distribution, ", ".join(packages_by_os) or "none")
        )
    flavor, flavor_why = kernel_modules(host_ccs, gpu_names, kernel_modules_override)
    chosen = choose_branch(catalogue, policy, floor, cluster_ccs, branch_max, branch, version, stack)
    target = dict(chosen, upstream=upstream_version(chosen["version"]), flavor=flavor, kept=False)

    # Never downgrade a driver that already runs the stack: moving a host from
    # R580 back to R570 means a reboot and older fixes for nothing.
    have = installed_driver(installed)
    if (
        have
        and not downgrade
        and version_tuple(have["upstream"]) >= version_tuple(floor)
        and version_tuple(have["upstream"]) > version_tuple(target["upstream"])
        and (kernel_modules_override == "auto" or have["flavor"] == flavor)
        and (have["flavor"] == flavor or not _flavor_required(host_ccs, gpu_names))
    ):
        target.update(
            branch=have["branch"],
            version=have["version"],
            upstream=have["upstream"],
            flavor=have["flavor"],
            kept=True,
            why="installed {} is newer than {} {} and meets the minimum {}: kept, not downgraded".format(
                have["upstream"], chosen["branch"], chosen["why"], floor
            ),
        )

    names = packages_by_os[distribution].get(target["flavor"])
    if not names:
        raise PlanError(f"nvidia_driver_packages_by_os.{distribution} names no {target['flavor']} packages")
    driver_pkgs = [str(n).format(branch=target["branch"]) for n in names]

    switches = parse_nvswitches(lspci)
    want_fm = fabricmanager == "always" or (fabricmanager == "auto" and bool(switches))
    want_nvlsm = want_fm and (nvlsm == "always" or (nvlsm == "auto" and is_blackwell(host_ccs)))
    fm_versioned, fm_other = fabric_packages(target["branch"], want_nvlsm) if want_fm else ([], [])

    versioned = driver_pkgs + fm_versioned
    wrong = [p for p in versioned if upstream_version(installed.get(p, "")) != target["upstream"]]
    missing = [p for p in fm_other if p not in installed]
    # Another branch's fabric packages (nvidia-fabricmanager-570 beside 580's
    # nvidia-fabricmanager) ship the same files and the same service: they go
    # when this branch's come.
    stale = (
        sorted(p for p in installed if _FABRIC_PACKAGE.match(p) and p not in fm_versioned + fm_other) if want_fm else []
    )
    return {
        "branch": target["branch"],
        "version": target["version"],
        "upstream": target["upstream"],
        "why": target["why"],
        "kept": target["kept"],
        "policy_choice": chosen,
        "installed": have,
        "kernel_modules": target["flavor"],
        "kernel_modules_why": flavor_why if not target["kept"] else "the installed driver's",
        "nvswitches": switches,
        "fabricmanager": want_fm,
        "nvlsm": want_nvlsm,
        "driver_packages": driver_pkgs,
        "fabric_packages": fm_versioned + fm_other,
        # Installed at the driver's exact version, pinned and held together.
        "versioned_packages": versioned,
        # Installed at the repository's version (nvlsm), held.
        "other_packages": fm_other,
        "hold": versioned + fm_other,
        "stale_packages": stale,
        "change": bool(wrong or missing or stale),
        "to_change": wrong + missing + stale,
    }


def _flavor_required(ccs, gpu_names):
    """True when the GPUs run only one flavour (so a kept driver must have it)."""
    return any(cc_tuple(c)[0] >= 10 or cc_tuple(c) < (7, 5) for c in ccs) or any(
        "GH200" in n or "GB200" in n for n in gpu_names
    )


# ---------------------------------------------------------------- fabric state


def parse_fabric(text):
    """Per GPU, the Fabric section of `nvidia-smi -q`:
    [{'gpu': '00000000:18:00.0', 'state': 'Completed', 'status': 'Success'}]."""
    gpus, current, in_fabric = [], None, False
    for raw in text.splitlines():
        line = raw.rstrip()
        m = re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$", line)
        if m:
            current = {"gpu": m.group(1), "state": None, "status": None}
            gpus.append(current)
            in_fabric = False
            continue
        if current is None:
            continue
        if re.match(r"^ {4}\S", line):
            # A section at the GPU's first level: Fabric, or another one.
            in_fabric = line.strip() == "Fabric"
            continue
        if in_fabric:
            kv = re.match(r"^ {8}(State|Status)\s*:\s*(.*)$", line)
            if kv:
                current[kv.group(1).lower()] = kv.group(2).strip()
    if not gpus:
        raise PlanError("nvidia-smi -q printed no GPU section (expected lines like 'GPU 00000000:18:00.0')")
    return gpus


def fabric_problems(gpus):
    """Why the fabric is not ready yet (empty: every GPU is registered):
    NVIDIA's states are Not Started, In Progress and Completed; the status is
    meaningful once Completed, and Success is the only good one."""
    problems = []
    for g in gpus:
        if g["state"] != "Completed":
            problems.append(f"GPU {g['gpu']}: fabric state {g['state'] or 'missing'}, expected Completed")
        elif g["status"] != "Success":
            problems.append(f"GPU {g['gpu']}: fabric state Completed with status {g['status']}, expected Success")
    return problems
