"""apt resolution, holds and branch switches against the stand-in NVIDIA
repository (tests/fixtures/nvidia_repo/build.py), for the package names the
nvidia_driver role asks for on Debian 12 and Ubuntu 24.04: the molecule nodes
run Debian 12 only, so Ubuntu's names are resolved here with `apt-get -s` in a
private apt root (no root rights, nothing installed)."""

import re
import shutil
import subprocess
import sys

import pytest
import yaml
from rolepy import MATRIX_TEXT, ROOT, fixture_text, shared

drv = shared("torchrig_driver")
pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("apt-get", "dpkg-deb", "gpg")), reason="needs apt-get, dpkg-deb and gpg"
)
PACKAGES = yaml.safe_load((ROOT / "roles/nvidia_driver/defaults/main.yml").read_text())["nvidia_driver_packages_by_os"]
CATALOGUE = yaml.safe_load(MATRIX_TEXT)["driver_branches"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("standin")
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests/fixtures/nvidia_repo/build.py"),
            str(ROOT / "roles/preflight/files/compat_matrix.yml"),
            str(out),
            "http://standin.invalid/repo/",
        ],
        check=True,
        capture_output=True,
    )
    return out


def status_entry(built, repo, name, version, held=False):
    """The package's stanza from the stand-in's Packages (its Depends,
    Provides, Conflicts), as dpkg records an installed package."""
    for stanza in (built / repo / "Packages").read_text().split("\n\n"):
        if f"Package: {name}\n" in stanza and f"Version: {version}\n" in stanza:
            keep = [ln for ln in stanza.splitlines() if not ln.startswith(("Filename", "Size", "MD5sum", "SHA256"))]
            keep.insert(1, f"Status: {'hold' if held else 'install'} ok installed")
            return "\n".join(keep) + "\n"
    raise AssertionError(f"{name} {version} is not in the stand-in's {repo}")


def apt(built, tmp_path, repo, installed, *args, pin=""):
    """apt-get -s in a private root whose dpkg status lists `installed` (and
    the role's pin file, when given)."""
    root = tmp_path / "root"
    for d in (
        "etc/apt/sources.list.d",
        "etc/apt/preferences.d",
        "var/lib/dpkg",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives/partial",
    ):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "etc/apt/sources.list").write_text(f"deb [trusted=yes] file:{built / repo} /\n")
    if pin:
        (root / "etc/apt/preferences.d/torchrig-nvidia-driver.pref").write_text(pin)
    dkms = "Package: dkms\nStatus: install ok installed\nVersion: 3.0.10-8\nArchitecture: all\n"
    dkms += "Maintainer: x\nDescription: x\n"
    status = [dkms] + [status_entry(built, repo, *i) for i in installed]
    (root / "var/lib/dpkg/status").write_text("\n".join(status))
    opts = [
        f"-oDir={root}",
        f"-oDir::State::status={root}/var/lib/dpkg/status",
        "-oAPT::Architecture=amd64",
        "-oDebug::NoLocking=1",
        f"-oDir::Etc::trustedparts={root}/etc/apt/trusted.gpg.d",
        "-q",
    ]
    subprocess.run(["apt-get", *opts, "update"], check=True, capture_output=True)
    return subprocess.run(
        ["apt-get", *opts, "-s", *args], check=False, capture_output=True, text=True, env={"LC_ALL": "C"}
    )


def install_args(p):
    # As the role asks: the pin's pattern ("580.*": the branch's newest point release).
    return [f"{n}={p['pin']}" for n in p["versioned_packages"]] + p["other_packages"]


def hgx_plan(distribution, installed=None, ccs=("9.0",)):
    return drv.plan(
        catalogue=CATALOGUE,
        policy="supported",
        floor="580.65.06",
        host_ccs=list(ccs),
        cluster_ccs=list(ccs),
        distribution=distribution,
        packages_by_os=PACKAGES,
        installed=installed or {},
        lspci=fixture_text("hgx-h100-8x.lspci"),
        # R580, the branch these tests were written for (620 and 595 have their own).
        branch_max="580",
    )


@pytest.mark.parametrize("distribution,repo", [("Debian", "repo"), ("Ubuntu", "repo-ubuntu2404")])
@pytest.mark.parametrize("ccs", [("9.0",), ("10.0",)])
def test_fresh_hgx_install_resolves(built, tmp_path, distribution, repo, ccs):
    p = hgx_plan(distribution, ccs=ccs)
    r = apt(built, tmp_path, repo, [], "install", *install_args(p))
    assert r.returncode == 0, r.stdout + r.stderr
    for name in p["versioned_packages"]:
        assert f"Inst {name} (580." in r.stdout
    assert ("Inst nvlsm " in r.stdout) == (ccs == ("10.0",))


@pytest.mark.parametrize(
    "distribution,repo,old",
    [
        (
            "Debian",
            "repo",
            [
                ("nvidia-open", "570.172.08-1"),
                ("nvidia-kernel-open-dkms", "570.172.08-1"),
                ("nvidia-smi", "570.172.08-1"),
                ("nvidia-persistenced", "570.172.08-1"),
            ],
        ),
        (
            "Ubuntu",
            "repo-ubuntu2404",
            [
                ("nvidia-driver-570-open", "570.172.08-0ubuntu1"),
                ("nvidia-dkms-570-open", "570.172.08-0ubuntu1"),
                ("nvidia-utils-570", "570.172.08-0ubuntu1"),
                ("nvidia-compute-utils-570", "570.172.08-0ubuntu1"),
            ],
        ),
    ],
)
def test_branch_switch_with_fabric_manager(built, tmp_path, distribution, repo, old):
    old = old + [("nvidia-fabricmanager-570", "570.172.08-1"), ("libnvidia-nscq-570", "570.172.08-1")]
    p = hgx_plan(distribution, installed=dict(old))
    assert p["change"] and p["stale_packages"] == ["libnvidia-nscq-570", "nvidia-fabricmanager-570"]
    # Held, as the role leaves them: apt cannot switch the branch
    # ("pkgProblemResolver::Resolve generated breaks, this may be caused by
    # held packages", as measured on NVIDIA's repository).
    held = apt(built, tmp_path, repo, [(n, v, True) for n, v in old], "install", *install_args(p))
    assert (held.returncode != 0 and "held packages" in held.stderr + held.stdout) or (
        "The following held packages will be changed:" in held.stdout
    ), held.stdout + held.stderr
    # Released first, as the role does: 580's packages replace 570's, and the
    # other branch's fabric packages are removed (the role removes them just
    # before; apt's resolver does not remove them for their Conflicts alone).
    free = apt(built, tmp_path, repo, old, "install", *install_args(p), *[f"{n}-" for n in p["stale_packages"]])
    assert free.returncode == 0, free.stdout + free.stderr
    assert "Remv nvidia-fabricmanager-570 " in free.stdout and "Remv libnvidia-nscq-570 " in free.stdout
    assert "Inst nvidia-fabricmanager (580.95.05-1 " in free.stdout


def test_ubuntu_r595_installs_under_the_new_names_with_its_pinning_package(built, tmp_path):
    # Issue 30 item 7: from R590 Ubuntu's packages drop the branch; the branch
    # is chosen by nvidia-driver-pinning-<branch>. On a46a43a the plan asked for
    # nvidia-driver-595-open, which does not exist.
    p = drv.plan(
        catalogue=CATALOGUE,
        policy="supported",
        floor="580.65.06",
        host_ccs=["9.0"],
        cluster_ccs=["9.0"],
        distribution="Ubuntu",
        packages_by_os=PACKAGES,
        branch="595",
    )
    assert p["driver_packages"] == ["nvidia-open", "nvidia-dkms-open"]
    # The role's pin (templates/nvidia-driver.pref.j2), written before the install.
    pin = f"Package: src:*nvidia* src:cuda-drivers* libnvsdm*\nPin: version {p['pin']}\nPin-Priority: 1000\n"
    r = apt(built, tmp_path, "repo-ubuntu2404", [], "install", *install_args(p), pin=pin)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Inst nvidia-driver-pinning-595 " in r.stdout and "Inst nvidia-open (595.58.03-0ubuntu1" in r.stdout
    assert "Inst nvidia-dkms-open (595.58.03-0ubuntu1" in r.stdout and "620." not in r.stdout


def test_persistence_mode_is_on_only_with_the_roles_drop_in(built, tmp_path):
    # Issue 30 item 5: the stand-in's unit is Ubuntu's (--no-persistence-mode);
    # its ExecStart leaves persistence off, the role's drop-in turns it on.
    root = tmp_path / "deb"
    deb = next((built / "repo-ubuntu2404").glob("nvidia-compute-utils-580_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    unit = (root / "lib/systemd/system/nvidia-persistenced.service").read_text()
    packaged = [ln.split("=", 1)[1] for ln in unit.splitlines() if ln.startswith("ExecStart=")]
    assert packaged == ["/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose"]
    tasks = yaml.safe_load((ROOT / "roles/nvidia_driver/tasks/services.yml").read_text())
    dropin = next(
        t["ansible.builtin.copy"]["content"]
        for t in tasks
        if "persistence-mode" in str(t.get("ansible.builtin.copy", ""))
    )
    # systemd: an empty ExecStart= resets the list; the last one runs.
    execs = [ln.split("=", 1)[1] for ln in (unit + dropin).splitlines() if ln.startswith("ExecStart=")]
    effective = execs[len(execs) - execs[::-1].index("") :] if "" in execs else execs
    assert effective == ["/usr/bin/nvidia-persistenced --persistence-mode --verbose"]
    daemon = root / "usr/bin/nvidia-persistenced"
    smi = tmp_path / "smi"
    subprocess.run(
        ["dpkg-deb", "-x", str(next((built / "repo-ubuntu2404").glob("nvidia-utils-580_*.deb"))), str(smi)], check=True
    )
    for cmd, mode in ((packaged[0], "Disabled"), (effective[0], "Enabled")):
        env = {"TORCHRIG_STANDIN_RUN": str(tmp_path / "run"), "PATH": "/usr/bin:/bin"}
        subprocess.run(["sh", str(daemon), *cmd.split()[1:]], check=True, env=env)
        q = subprocess.run(
            ["sh", str(smi / "usr/bin/nvidia-smi"), "-q"], check=True, capture_output=True, text=True, env=env
        ).stdout
        assert re.search(rf"Persistence Mode\s+: {mode}", q), q
