"""What the controller keeps in ~/.cache/torchrig when two runs use it at once
(clusters provisioned side by side from one controller, molecule scenarios in
parallel): each entry is complete or absent, and the second run waits for the
first and uses its result instead of failing.

The wheelhouse's case is in test_wheel_lock.py, the job venv's in test_job_venv.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from rolepy import COLLECTIONS, ROOT, shared

FILES = ROOT / "roles/pytorch/files"
BUILD = FILES / "build_training_wheel.py"
cache_lock = shared("cache_lock")

# A build backend in the source tree itself (PEP 517 backend-path) that needs
# nothing from an index, so pip builds offline; each build is logged.
BACKEND = '''
import os, zipfile

META = "Metadata-Version: 2.1\\nName: tiny\\nVersion: 1.0\\n"


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    os.makedirs(os.path.join(metadata_directory, "tiny-1.0.dist-info"))
    with open(os.path.join(metadata_directory, "tiny-1.0.dist-info", "METADATA"), "w") as f:
        f.write(META)
    return "tiny-1.0.dist-info"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    if os.environ.get("TINY_FAIL"):
        raise SystemExit("tiny: refusing to build")
    with open(os.environ["TINY_LOG"], "a") as f:
        f.write("built\\n")
    name = "tiny-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        z.writestr("tiny.py", "")
        z.writestr("tiny-1.0.dist-info/METADATA", META)
        z.writestr("tiny-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
        z.writestr("tiny-1.0.dist-info/RECORD", "")
    return name
'''


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n')
    (src / "backend.py").write_text(BACKEND)
    return src


def start_build(source: Path, dest: Path, log: Path, **env: str) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    # As the pytorch role runs it: torchrig.cluster (its cache_lock) on the path.
    clean.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                 PYTHONPATH=COLLECTIONS, TINY_LOG=str(log), **env)
    return subprocess.Popen([sys.executable, str(BUILD), str(source), str(dest)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean)


def test_two_builds_of_one_hash_at_once_build_once_and_both_succeed(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "training/0123abcd"
    dest.parent.mkdir()
    log = tmp_path / "builds.log"
    with cache_lock.held(str(dest)):  # both runs are surely there at once
        runs = [start_build(source, dest, log) for _ in range(2)]
        with pytest.raises(subprocess.TimeoutExpired):
            runs[0].wait(timeout=2)
        assert runs[1].poll() is None
    outs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outs]
    assert sorted(json.loads(out)["built"] for out, _ in outs) == [False, True]
    assert log.read_text() == "built\n"
    assert sorted(os.listdir(dest)) == [".built", "tiny-1.0-py3-none-any.whl"]
    with zipfile.ZipFile(dest / "tiny-1.0-py3-none-any.whl") as z:
        assert z.testzip() is None
    assert sorted(os.listdir(dest.parent)) == ["0123abcd", "0123abcd.lock"]  # no .partial- left


def test_a_failed_build_leaves_no_directory(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "training/0123abcd"
    run = start_build(source, dest, tmp_path / "builds.log", TINY_FAIL="1")
    out, err = run.communicate(timeout=120)
    assert run.returncode == 1 and out == ""
    assert f"build_training_wheel: pip could not build the wheel of {source}" in err
    assert sorted(os.listdir(dest.parent)) == ["0123abcd.lock"]  # the next run builds again


def test_a_directory_without_its_marker_is_built_again(source: Path, tmp_path: Path) -> None:
    # What a build killed halfway left when builds went into the directory itself.
    dest = tmp_path / "training/0123abcd"
    dest.mkdir(parents=True)
    (dest / "tiny-1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 cut short")
    log = tmp_path / "builds.log"
    run = start_build(source, dest, log)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    assert json.loads(out) == {"dir": str(dest), "built": True}
    with zipfile.ZipFile(dest / "tiny-1.0-py3-none-any.whl") as z:
        assert z.testzip() is None


# --- the node image's tarball (roles/local_cluster/files/build-node-image.sh) ---------------

IMAGE_SCRIPT = ROOT / "roles/local_cluster/files/build-node-image.sh"
ZIP_BYTECODE = ROOT / "roles/local_cluster/files/torchrig_zip_bytecode.py"
ANSIBALLZ_SCAN = ROOT / "roles/local_cluster/files/torchrig_ansiballz_scan.py"

# Stand-ins for debootstrap (a root tree with a file big enough that tar takes
# a moment; it returns once both builds have got this far, so that they tar at
# the same time) and chroot (nothing to run inside a fake tree).
FAKE_DEBOOTSTRAP = """#!/bin/bash
set -eu
root=${@: -2:1}
mkdir -p "$root/etc/ssh/sshd_config.d" "$root/etc/sudoers.d" "$root/usr/local/share/ca-certificates" \
  "$root/usr/lib/python3/dist-packages"
head -c 30000000 /dev/urandom > "$root/payload"
touch "$BARRIER/$$"
for _ in $(seq 100); do [ "$(ls "$BARRIER" | wc -l)" -ge 2 ] && exit 0; sleep 0.1; done
"""


def test_two_image_builds_at_once_each_leave_a_complete_tarball(tmp_path: Path) -> None:
    bin_dir, barrier, cache = tmp_path / "bin", tmp_path / "barrier", tmp_path / "cache"
    for d in (bin_dir, barrier, cache):
        d.mkdir()
    (bin_dir / "debootstrap").write_text(FAKE_DEBOOTSTRAP)
    (bin_dir / "chroot").write_text("#!/bin/sh\nexit 0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "BARRIER": str(barrier)}
    out = cache / "node-abc123.tar"
    runs = [subprocess.Popen(["bash", str(IMAGE_SCRIPT), str(out), "bookworm", "http://mirror.invalid", "systemd",
                              "admin", str(ZIP_BYTECODE)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
            for _ in range(2)]
    results = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in results]
    listed = subprocess.run(["tar", "-tvf", str(out)], capture_output=True, text=True, check=True).stdout
    assert any(line.split()[2] == "30000000" and line.endswith("./payload") for line in listed.splitlines())
    # The system Python's zip-import bytecode cache, and the .pth that starts it.
    names = {line.split()[-1] for line in listed.splitlines()}
    assert {"./usr/lib/python3/dist-packages/torchrig_zip_bytecode.py",
            "./usr/lib/python3/dist-packages/torchrig_zip_bytecode.pth"} <= names
    assert sorted(os.listdir(cache)) == ["node-abc123.tar"]  # no temporary file left
    assert oct(out.stat().st_mode & 0o777) == "0o644"


# --- the controller venv (Makefile: $(VENV_CACHE)/.torchrig-setup) ---------------------------

# python3 as the Makefile runs it, except that `-m venv DIR` makes a venv whose
# pip only logs what it was asked (and takes a moment, as the real one does).
FAKE_PYTHON3 = f"""#!/bin/bash
if [ "$1 $2" = "-m venv" ]; then
  echo "venv $3" >> "$SETUP_LOG"
  mkdir -p "$3/bin"
  printf '#!/bin/bash\\necho "pip $*" >> "$SETUP_LOG"\\nsleep 0.3\\n' > "$3/bin/pip"
  chmod +x "$3/bin/pip"
  ln -s {sys.executable} "$3/bin/python"
  exit 0
fi
exec {sys.executable} "$@"
"""


def test_two_checkouts_setting_up_at_once_build_the_shared_venv_once(tmp_path: Path) -> None:
    bin_dir, home, log = tmp_path / "bin", tmp_path / "home", tmp_path / "setup.log"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON3)
    (bin_dir / "python3").chmod(0o755)
    checkouts = [tmp_path / "a", tmp_path / "b"]
    for checkout in checkouts:
        (checkout / "training").mkdir(parents=True)
        (checkout / "playbooks/files").mkdir(parents=True)
        (checkout / "roles/local_cluster/files").mkdir(parents=True)
        for name in ("Makefile", "requirements.txt", "training/pyproject.toml", "playbooks/files/controller_python.py",
                     "roles/local_cluster/files/torchrig_zip_bytecode.py",
                     "roles/local_cluster/files/torchrig_ansiballz_scan.py"):
            (checkout / name).write_bytes((ROOT / name).read_bytes())
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(home), "SETUP_LOG": str(log)}
    env.pop("MAKEFLAGS", None)
    runs = [subprocess.Popen(["make", "--no-print-directory", "-C", str(checkout), "venv"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env) for checkout in checkouts]
    outs = [run.communicate(timeout=120)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outs
    lines = log.read_text().splitlines()
    assert len([line for line in lines if line.startswith("venv ")]) == 1, lines  # built once, never removed
    venv = Path(lines[0].split(" ", 1)[1])
    assert (venv / ".torchrig-setup").exists()
    assert [os.readlink(checkout / ".venv") for checkout in checkouts] == [str(venv), str(venv)]
    # Each checkout installed its own training package into it.
    assert len([line for line in lines if line.endswith("--no-deps -e training")]) == 2
    # And the venv's Python keeps the code of localhost tasks' modules compiled, in the user's cache.
    site = venv / f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    assert (site / "torchrig_zip_bytecode.py").read_bytes() == ZIP_BYTECODE.read_bytes()
    assert (site / "torchrig_zip_bytecode.pth").read_text() == (
        f"import torchrig_zip_bytecode; torchrig_zip_bytecode.install('{home}/.cache/torchrig/zip-bytecode')\n")
    # And Ansible in it keeps its scans of modules' imports there too.
    assert (site / "torchrig_ansiballz_scan.py").read_bytes() == ANSIBALLZ_SCAN.read_bytes()
    assert (site / "torchrig_ansiballz_scan.pth").read_text() == (
        f"import torchrig_ansiballz_scan; torchrig_ansiballz_scan.install('{home}/.cache/torchrig/ansiballz-scan')\n")
    # Both compiled: every Python of the venv imports them at its start.
    tag = sys.implementation.cache_tag
    assert {f"torchrig_zip_bytecode.{tag}.pyc", f"torchrig_ansiballz_scan.{tag}.pyc"} <= {
        p.name for p in (site / "__pycache__").iterdir()}


def test_the_controllers_keys_are_kept_out_of_its_caches() -> None:
    """A cache cleaner (or `rm -rf ~/.cache/torchrig`, as a cold CI run does) may empty
    ~/.cache at any time: a signing or SSH key kept there would be rotated unasked. Every
    role's key directory defaults under ~/.local/share/torchrig, and nothing under
    ~/.cache/torchrig is named for a key."""
    key_dirs, cached = {}, {}
    for defaults in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        for name, value in (yaml.safe_load(defaults.read_text()) or {}).items():
            if name.endswith("_key_dir"):
                key_dirs[name] = value
            if isinstance(value, str) and "/.cache/torchrig" in value:
                cached[name] = value
    assert set(key_dirs) >= {"package_source_key_dir", "ssh_trust_key_dir"}, key_dirs
    assert {n: v for n, v in key_dirs.items() if "/.local/share/torchrig/" not in v} == {}
    assert [n for n in cached if "key" in n or "ssh" in n] == [], cached
