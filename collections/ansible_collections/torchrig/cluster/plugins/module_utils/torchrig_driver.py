"""The driver plan: which NVIDIA driver branch, kernel modules and fabric
packages a host gets, and whether its NVSwitch fabric is up.

Pure functions over facts and command output, so they are unit-tested on
recorded output (tests/test_driver_plan.py) and used by the nvidia_driver role's
modules on the hosts and by the preflight role's torchrig_stack filter on the
controller (its Secure Boot guard).
"""

from __future__ import annotations

import os
import re

NVIDIA_VENDOR = "10de"
MELLANOX_VENDOR = "15b3"
# NVSwitch chips show in lspci as NVIDIA "Bridge [0680]" functions (HGX/DGX
# A100, H100, H200 boards). GPUs are 0300/0302; the RTX audio function is 0403.
NVSWITCH_PCI_CLASS = "0680"

# Blackwell HGX/DGX (B200, B300: NVLink 5): the NVSwitch trays are not PCI
# functions of the host, so class 0680 never shows. They are managed through
# ConnectX bridges whose PCI VPD names SW_MNG; NVIDIA's driver container
# detects NVLink 5 that way (_assert_nvlink5_system in
# NVIDIA/gpu-driver-container ubuntu24.04/nvidia-driver, PR #246/#281), then
# waits for mlx5_core and ib_umad and installs nvlsm and infiniband-diags
# (ubuntu24.04/install.sh nvlink5_pkgs_install). The VPD is read from the PCI
# device (/sys/bus/pci/devices/*/vpd, the same file as
# /sys/class/infiniband/*/device/vpd), so it is found before mlx5_ib is
# loaded (NVIDIA/gpu-operator#2781: no IB device without it).
NVLINK5_VPD_MARK = b"SW_MNG"
NVLINK5_KERNEL_MODULES = ("mlx5_core", "ib_umad")
# From the distribution's own repository (rdma-core), not NVIDIA's.
NVLINK5_OS_PACKAGES = ("infiniband-diags",)

# Branch kinds from NVIDIA's data-centre driver lifecycle: long_term (LTSB,
# about three years of fixes), production (PB, about one year), new_feature
# (NFB, a few months, then no security fixes), ended (past its end of life or
# gone from NVIDIA's support table: no policy chooses it; only a matrix row's
# own branch with policy stack, or nvidia_driver_branch by hand).
BRANCH_KINDS = ("long_term", "production", "new_feature", "ended")
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
# From R590 NVIDIA's Ubuntu packages drop the branch (nvidia-dkms-open,
# nvidia-dkms; NVIDIA driver installation guide, "Ubuntu 590 and later
# packages"), so the branch is read from the version, never from the name.
_DKMS_PACKAGE = re.compile(r"^(nvidia-kernel-(open-)?dkms|nvidia-dkms(-\d+)?(-open)?)$")

_FABRIC_PACKAGE = re.compile(r"^(nvidia-fabricmanager|libnvidia-nscq|libnvsdm)(-\d+)?$")
# NVIDIA's branch-locking packages (apt preferences for one branch), from R590.
_PINNING_PACKAGE = re.compile(r"^nvidia-driver-pinning-\d+$")

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


def read_pci_devices(root):
    """PCI functions from sysfs (root: /sys/bus/pci/devices or a recorded copy):
    [{'slot', 'vendor', 'device', 'class', 'vpd'}]. The VPD is read only for
    Mellanox functions (the NVLink 5 bridges): reading other devices' VPD can
    be slow or fail, and nothing else is looked for in it."""
    devices = []
    if not root or not os.path.isdir(root):
        return devices
    for slot in sorted(os.listdir(root)):
        d = os.path.join(root, slot)

        def field(name, d=d):
            try:
                with open(os.path.join(d, name)) as f:
                    return f.read().strip().lower().removeprefix("0x")
            except OSError:
                return ""

        dev = {"slot": slot, "vendor": field("vendor"), "device": field("device"), "class": field("class")[:4]}
        dev["vpd"] = b""
        if dev["vendor"] == MELLANOX_VENDOR:
            try:
                with open(os.path.join(d, "vpd"), "rb") as f:
                    dev["vpd"] = f.read()
            except OSError:
                # No VPD capability, or the firmware refuses the read: not a bridge we can tell.
                pass
        devices.append(dev)
    return devices


def nvlink5_bridges(devices):
    """The ConnectX functions that manage a Blackwell NVLink 5 switch tray
    (SW_MNG in their VPD): [{'pci_bus_id', 'pci_device_id'}]."""
    return [
        {"pci_bus_id": d["slot"], "pci_device_id": f"{d['vendor']}:{d['device']}"}
        for d in devices
        if d["vendor"] == MELLANOX_VENDOR and NVLINK5_VPD_MARK in (d.get("vpd") or b"")
    ]


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


def driver_package_names(packages_by_os, distribution, branch):
    """The driver's package names for this distribution and branch:
    {'open': [...], 'proprietary': [...], 'pinning': name or ''}, {branch}
    replaced. An entry is a mapping (every branch) or a list of mappings with
    from_branch: the one with the highest from_branch at or below the branch
    applies (Ubuntu's names change at R590)."""
    if distribution not in packages_by_os:
        raise PlanError(
            "no driver packages are named for {} in nvidia_driver_packages_by_os (it has {}); expected an entry "
            "for this distribution".format(distribution, ", ".join(packages_by_os) or "none")
        )
    entries = packages_by_os[distribution]
    entries = [entries] if isinstance(entries, dict) else entries
    where = f"nvidia_driver_packages_by_os.{distribution}"
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise PlanError(f"{where} must be a mapping (open, proprietary) or a list of them with from_branch")
    fits = []
    for e in entries:
        start = e.get("from_branch", 0)
        if not str(start).isdigit():
            raise PlanError(f"{where}: from_branch {start!r} is not a branch number like 590")
        if int(start) <= int(branch):
            fits.append((int(start), e))
    if not fits:
        raise PlanError(f"{where} names no packages for branch {branch} (every entry's from_branch is above it)")
    entry = max(fits, key=lambda f: f[0])[1]
    return {
        "open": [str(n).format(branch=branch) for n in entry.get("open") or []],
        "proprietary": [str(n).format(branch=branch) for n in entry.get("proprietary") or []],
        "pinning": str(entry.get("pinning") or "").format(branch=branch),
    }


_UNAME = re.compile(r"^\d+\.\d+\.\d+(?:-\d+)?(?:\+bpo)?-(?P<flavour>[a-z][a-z0-9-]*)$")
# Ubuntu's GA kernel per release: a newer one running is the HWE kernel, whose
# headers meta package is linux-headers-<flavour>-hwe-<release>.
UBUNTU_GA_KERNEL = {"20.04": (5, 4), "22.04": (5, 15), "24.04": (6, 8)}
_UBUNTU_HWE_FLAVOURS = ("generic", "generic-64k", "lowlatency", "lowlatency-64k")


def kernel_headers_meta(distribution, distribution_version, kernel_release):
    """The headers meta package that follows the running kernel's flavour to
    every new kernel, so DKMS builds the nvidia module for the next kernel
    before its first boot. Debian: '6.1.0-18-cloud-amd64' -> linux-headers-cloud-amd64
    ('6.12.9+bpo-amd64' -> linux-headers-amd64). Ubuntu: '6.8.0-1015-aws' ->
    linux-headers-aws; '6.8.0-49-generic' on 22.04 (GA 5.15) ->
    linux-headers-generic-hwe-22.04."""
    m = _UNAME.match(str(kernel_release).strip())
    if not m:
        raise PlanError(
            f"kernel release {kernel_release!r} (uname -r) does not read as VERSION-ABI-FLAVOUR (e.g. "
            "6.1.0-18-amd64, 6.8.0-49-generic), so its headers meta package cannot be told. Expected: a "
            "distribution kernel, or nvidia_driver_kernel_headers_meta set to the package name (or empty for none)."
        )
    flavour = m.group("flavour")
    if distribution == "Ubuntu" and flavour in _UBUNTU_HWE_FLAVOURS:
        release = str(distribution_version)
        ga = UBUNTU_GA_KERNEL.get(release)
        running = tuple(int(x) for x in str(kernel_release).split(".")[:2])
        if ga and running > ga:
            return f"linux-headers-{flavour}-hwe-{release}"
    if distribution not in ("Debian", "Ubuntu"):
        raise PlanError(f"no headers meta package is known for {distribution}; expected Debian or Ubuntu")
    return f"linux-headers-{flavour}"


def peermem(setting, adapters=(), bridges=(), peer_memory=False, flavor="", kernel_release=""):
    """(load nvidia-peermem at boot?, why). never (default) / always / auto.
    auto loads it only where it is needed and can work: an InfiniBand HCA
    (not an Ethernet ConnectX, not an NVLink 5 switch bridge), a kernel with
    the peer-memory API (MLNX_OFED / DOCA-OFED's ib_core creates
    /sys/kernel/mm/memory_peers; inbox kernels lack it and the module fails
    to load at every boot), and no DMA-BUF: with the open kernel modules on
    Linux 5.12 or newer NCCL uses DMA-BUF, which NVIDIA recommends over
    nvidia-peermem ("NVIDIA recommends using the DMA-BUF rather than using the
    nvidia-peermem kernel module": GPU Operator docs, "GPUDirect RDMA and
    GPUDirect Storage",
    https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-operator-rdma.html;
    DMA-BUF needs the open modules and kernel 5.12+; the peer-memory API:
    https://docs.nvidia.com/cuda/gpudirect-rdma/index.html)."""
    if isinstance(setting, bool):
        setting = "always" if setting else "never"
    setting = str(setting).lower()
    if setting in ("true", "yes"):
        setting = "always"
    if setting in ("false", "no"):
        setting = "never"
    if setting not in ("auto", "always", "never"):
        raise PlanError(f"nvidia_driver_peermem is {setting!r}; expected never, auto or always")
    if setting != "auto":
        return setting == "always", f"nvidia_driver_peermem is {setting}"
    bridge_slots = {_slot(b["pci_bus_id"]) for b in bridges}
    hcas = [a for a in adapters if a.get("kind") == "infiniband" and _slot(a["pci_bus_id"]) not in bridge_slots]
    if not hcas:
        return False, "no InfiniBand HCA (Ethernet ConnectX and NVLink 5 switch bridges do not use it)"
    if not peer_memory:
        return False, "the kernel has no peer-memory API (/sys/kernel/mm/memory_peers; MLNX_OFED/DOCA-OFED provides it)"
    kernel = tuple(int(x) for x in re.findall(r"\d+", str(kernel_release))[:2]) or (0, 0)
    if flavor == "open" and kernel >= (5, 12):
        return False, "DMA-BUF is available (open kernel modules, Linux 5.12+): NCCL uses it instead"
    return True, "InfiniBand HCA {} with peer memory and no DMA-BUF".format(", ".join(a["pci_bus_id"] for a in hcas))


def _slot(pci_bus_id):
    """'0000:1a:00.0' (sysfs) and '1a:00.0' (lspci) -> '1a:00.0'."""
    return pci_bus_id.split(":", 1)[1] if pci_bus_id.count(":") == 2 else pci_bus_id


def running_driver(version):
    """The driver a host runs (nvidia-smi's or /proc/driver/nvidia/version's
    '580.95.05'), as installed_driver describes one; the flavour is not told
    (None: taken to be the one the plan picks). None without a version."""
    if not version:
        return None
    upstream = upstream_version(version)
    version_tuple(upstream)
    return {"package": "", "version": upstream, "upstream": upstream, "branch": upstream.split(".")[0], "flavor": None}


def driver_decision(
    *,
    catalogue,
    policy,
    floor,
    host_ccs,
    cluster_ccs,
    gpu_names=(),
    have=None,
    kernel_modules_override="auto",
    branch_max="",
    branch="",
    version="",
    stack=None,
    downgrade=False,
    update=False,
):
    """The one decision of which driver a host ends up with, shared by the plan
    (have: the installed kernel module package, from installed_driver) and
    preflight's Secure Boot guard (have: the running driver, running_driver).

    Returns {'chosen': the policy's choice, 'target': {'branch', 'version',
    'upstream', 'flavor', 'kept', 'why'}, 'exact', 'flavor_why',
    'module_change': why the nvidia kernel module is rebuilt or replaced ('':
    it is not)}. A module change is a first install, another branch, another
    flavour, another point release (below the catalogue's, or not the one named
    in nvidia_driver_version), or nvidia_driver_update's newest point release:
    each is a new DKMS build, which Secure Boot loads only when signed."""
    cluster_ccs = sorted(set(cluster_ccs) | set(host_ccs), key=cc_tuple)
    flavor, flavor_why = kernel_modules(host_ccs, gpu_names, kernel_modules_override)
    chosen = choose_branch(catalogue, policy, floor, cluster_ccs, branch_max, branch, version, stack)
    target = dict(chosen, upstream=upstream_version(chosen["version"]), flavor=flavor, kept=False)
    exact = bool(version)
    if have and have.get("flavor") is None:
        have = dict(have, flavor=flavor)

    # Never downgrade a driver that already runs the stack: moving a host from
    # R595 back to R580 means a reboot and older fixes for nothing.
    if (
        have
        and not downgrade
        and version_tuple(have["upstream"]) >= version_tuple(floor)
        and int(have["branch"]) > int(target["branch"])
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
        exact = False
    return {
        "chosen": chosen,
        "target": target,
        "exact": exact,
        "flavor_why": flavor_why,
        "module_change": _module_change(target, have, exact, update),
    }


def _module_change(target, have, exact, update):
    branch, upstream = str(target["branch"]), target["upstream"]
    if target["kept"]:
        return ""
    if not have:
        return f"no NVIDIA driver is installed: branch {branch} ({target['why']}) would be built"
    if str(have["branch"]) != branch:
        return f"driver {have['upstream']} would be replaced by branch {branch} ({target['why']})"
    if have["flavor"] != target["flavor"]:
        return "driver {}'s {} kernel modules would be replaced by the {} ones".format(
            have["upstream"], have["flavor"], target["flavor"]
        )
    if exact and have["upstream"] != upstream:
        return f"driver {have['upstream']} would be replaced by {upstream} (nvidia_driver_version)"
    if not exact and version_tuple(have["upstream"]) < version_tuple(upstream):
        return f"driver {have['upstream']} would be upgraded to the newest point release of branch {branch}"
    if update and not exact:
        return (
            f"driver {have['upstream']} would be upgraded to the newest point release of branch {branch} "
            "(nvidia_driver_update)"
        )
    return ""


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
    pci_devices=(),
    kernel_modules_override="auto",
    fabricmanager="auto",
    nvlsm="auto",
    branch_max="",
    branch="",
    version="",
    stack=None,
    downgrade=False,
    update=False,
):
    """Everything the role installs on one GPU host, decided before anything changes.

    The driver follows a branch, not a point release: the pin and the install
    take the newest point release of the chosen branch in the repository
    (pin: "<branch>.*"); an installed point release of that branch at or above
    the catalogue's version is kept until update (nvidia_driver_update) asks
    for the newest. Only a version named by hand (nvidia_driver_version) is
    pinned exactly."""
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
    have = installed_driver(installed)
    d = driver_decision(
        catalogue=catalogue,
        policy=policy,
        floor=floor,
        host_ccs=host_ccs,
        cluster_ccs=cluster_ccs,
        gpu_names=gpu_names,
        have=have,
        kernel_modules_override=kernel_modules_override,
        branch_max=branch_max,
        branch=branch,
        version=version,
        stack=stack,
        downgrade=downgrade,
        update=update,
    )
    chosen, target, exact, flavor_why = d["chosen"], d["target"], d["exact"], d["flavor_why"]

    names = driver_package_names(packages_by_os, distribution, target["branch"])
    driver_pkgs = names[target["flavor"]]
    if not driver_pkgs:
        raise PlanError(f"nvidia_driver_packages_by_os.{distribution} names no {target['flavor']} packages")
    pinning = [names["pinning"]] if names["pinning"] else []

    switches = parse_nvswitches(lspci)
    bridges = nvlink5_bridges(pci_devices)
    want_fm = fabricmanager == "always" or (fabricmanager == "auto" and bool(switches or bridges))
    # NVLink 5 (the SW_MNG bridges) needs nvlsm whatever the GPUs report.
    want_nvlsm = want_fm and (nvlsm == "always" or (nvlsm == "auto" and (is_blackwell(host_ccs) or bool(bridges))))
    fm_versioned, fm_other = fabric_packages(target["branch"], want_nvlsm) if want_fm else ([], [])
    nvlink5 = bool(bridges) and want_fm
    os_pkgs = list(NVLINK5_OS_PACKAGES) if nvlink5 else []
    fabric_modules = list(NVLINK5_KERNEL_MODULES) if nvlink5 else []

    versioned = driver_pkgs + fm_versioned
    others = pinning + fm_other + os_pkgs
    # What is installed of this branch now: every versioned package on one
    # point release of the branch, at or above the catalogue's (exact: that one).
    now = {p: upstream_version(installed[p]) for p in versioned if p in installed}
    on_branch = [p for p in versioned if p in now and now[p].split(".")[0] == str(target["branch"])]
    releases = {now[p] for p in on_branch}
    if exact or target["kept"]:
        good = {target["upstream"]} if exact else releases
    else:
        good = {r for r in releases if version_tuple(r) >= version_tuple(target["upstream"])}
    wrong = [p for p in versioned if p not in on_branch or now[p] not in good]
    if len(releases) > 1:
        # Fabric Manager at another point release than the driver refuses to start.
        wrong = sorted(set(wrong) | set(on_branch))
    missing = [p for p in others if p not in installed]
    # Another branch's fabric packages (nvidia-fabricmanager-570 beside 580's
    # nvidia-fabricmanager) ship the same files and the same service, and
    # another branch's pinning package pins another branch: they go when this
    # branch's come.
    stale = sorted(
        p
        for p in installed
        if p not in versioned + others and ((want_fm and _FABRIC_PACKAGE.match(p)) or _PINNING_PACKAGE.match(p))
    )
    change = bool(wrong or missing or stale) or (bool(update) and not target["kept"])
    if not change and len(releases) == 1:
        upstream = releases.pop()
    else:
        upstream = target["upstream"] if (exact or target["kept"]) else ""
    pin = f"{target['upstream']}-*" if exact else f"{target['branch']}.*"
    return {
        "branch": target["branch"],
        "version": target["version"],
        # The point release installed (after this plan, when nothing changes);
        # empty when apt chooses it (the branch's newest): read it after the install.
        "upstream": upstream,
        # apt's pin and the install's version pattern.
        "pin": pin,
        "why": target["why"],
        "kept": target["kept"],
        "policy_choice": chosen,
        "installed": have,
        "kernel_modules": target["flavor"],
        "kernel_modules_why": flavor_why if not target["kept"] else "the installed driver's",
        "nvswitches": switches,
        "nvlink5_bridges": bridges,
        "fabricmanager": want_fm,
        "nvlsm": want_nvlsm,
        # Loaded at every boot on NVLink 5 boards, before Fabric Manager and nvlsm start.
        "fabric_kernel_modules": fabric_modules,
        "driver_packages": driver_pkgs,
        "pinning_packages": pinning,
        "fabric_packages": fm_versioned + fm_other + os_pkgs,
        # Installed at one point release of the branch (pin), held together.
        "versioned_packages": versioned,
        # Installed at the repository's version (the pinning package, nvlsm,
        # the OS's infiniband-diags), held with the driver's.
        "other_packages": others,
        "hold": pinning + versioned + fm_other,
        "stale_packages": stale,
        "change": change,
        # Why the nvidia kernel module is rebuilt or replaced ('': it is not);
        # preflight's Secure Boot guard asks the same question (driver_decision).
        "module_change": d["module_change"],
        "to_change": wrong + missing + stale or (["the newest point release of " + target["branch"]] if change else []),
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
