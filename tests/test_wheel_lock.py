"""The wheelhouse lock (roles/pytorch/files/wheel_lock.py, fill_wheelhouse.py): every wheel a
cluster installs is pinned by sha256, pip installs it with --require-hashes, and an altered,
missing or extra wheel is named with what to do.

Tiny real wheels are written by hand (zip: module, METADATA, WHEEL, RECORD) so that real pip
installs and downloads them offline: pip runs with no config file (PIP_CONFIG_FILE=devnull)
and only the test's directories as sources.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from rolepy import COLLECTIONS, ROOT, shared

FILES = ROOT / "roles/pytorch/files"
CHECKER = FILES / "wheel_lock.py"
FILL = FILES / "fill_wheelhouse.py"
COMMITTED = FILES / "locks/torch2.14.1-cu130-py3.11-x86_64.txt"
NODE_PYTHON = "/usr/bin/python3"  # the nodes' system Python runs the checker



def _load_fill():
    """fill_wheelhouse by path, registered in sys.modules (its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location("fill_wheelhouse", FILL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fill_wheelhouse"] = module
    spec.loader.exec_module(module)
    return module


fill = _load_fill()
wl = fill.wheel_lock  # the module fill imports: the same code writes and checks the lock

HERE_PY = "{}.{}".format(*sys.version_info[:2])
HERE_MACHINE = platform.machine()
HERE_GLIBC = platform.libc_ver()[1]


def make_wheel(directory: Path, dist: str, version: str, body: str = "") -> Path:
    """A minimal valid pure-Python wheel; dist is the project name as METADATA spells it."""
    stem = wl.normalize(dist).replace("-", "_")
    info = f"{stem}-{version}.dist-info"
    files = {
        f"{stem}.py": f"VERSION = {version!r}\n{body}",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test_wheel_lock\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def alter_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def request(**changes: object) -> object:
    """The role's request for the committed row (defaults/main.yml lists), with changes."""
    fields = {
        "torch": ("torch==2.14.1", "torchvision==0.29.1"),
        "deps": ("numpy", "pyyaml", "safetensors", "tensorboard", "matplotlib", "tqdm", "scikit-learn"),
        "nodeps": ("mlxtend",),
        "index_url": "",
        "python": "3.11",
        "machine": "x86_64",
        "glibc": "2.36",
        "variant": "cu130",
    }
    fields.update(changes)
    return fill.Request(**fields)


@pytest.fixture
def house(tmp_path: Path) -> tuple[Path, Path]:
    """A wheelhouse of three wheels and its lock, written by fill's own code path."""
    directory = tmp_path / "wheelhouse"
    make_wheel(directory, "Alpha_Pkg", "1.0")
    make_wheel(directory, "Beta.Thing", "2.0")
    make_wheel(directory, "gamma", "0.3")
    lock = Path(fill.write_lock(str(directory), request(deps=("alpha-pkg", "beta.thing"), nodeps=("gamma",))))
    return directory, lock


def check(lock: Path, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([NODE_PYTHON, str(CHECKER), "check", "--lock", str(lock), "--dir", str(directory)],
                          capture_output=True, text=True, timeout=120, check=False)


def pip_env(**extra: str) -> dict[str, str]:
    """pip with no config file and none of this machine's PIP_* settings: only the test's sources."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    # fill_wheelhouse.py as the pytorch role runs it: the collection on its path.
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONPATH=COLLECTIONS, **extra)
    return env


def pip_install(python: str, lock: Path, directory: Path, target: Path) -> subprocess.CompletedProcess[str]:
    """The nodes' locked install (into --target instead of the venv)."""
    return subprocess.run(
        [python, "-m", "pip", "install", "--no-index", "--no-deps", "--require-hashes", "-r", str(lock),
         "--find-links", str(directory), "--target", str(target)],
        capture_output=True, text=True, timeout=300, check=False, env=pip_env(),
    )


def explain(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([NODE_PYTHON, str(CHECKER), "explain"], input=text, capture_output=True, text=True,
                          timeout=60, check=False)


# --- the lock file ---------------------------------------------------------------------------


def test_lock_lists_every_wheel_with_its_hash_normalised_and_sorted(house: tuple[Path, Path]) -> None:
    directory, lock = house
    pins = [line for line in lock.read_text().splitlines() if not line.startswith("#")]
    assert pins == [
        f"alpha-pkg==1.0 --hash=sha256:{sha256(directory / 'alpha_pkg-1.0-py3-none-any.whl')}",
        f"beta-thing==2.0 --hash=sha256:{sha256(directory / 'beta_thing-2.0-py3-none-any.whl')}",
        f"gamma==0.3 --hash=sha256:{sha256(directory / 'gamma-0.3-py3-none-any.whl')}",
    ]
    header = wl.read(str(lock)).header
    assert "generated" in header["torchrig-lock"]
    assert header["stack"] == "torch==2.14.1 torchvision==0.29.1 (cu130)"
    assert header["target"] == "python=3.11 machine=x86_64 glibc=2.36"
    assert header["no-deps"] == "gamma"


def test_lock_format_round_trips() -> None:
    pins = [wl.Pin("zeta", "1.0", ("a" * 64,)), wl.Pin("torch", "2.14.1+cu130", ("b" * 64, "c" * 64))]
    header = {"stack": "torch==2.14.1 torchvision==0.29.1 (cu130)", "no-deps": ""}
    text = wl.render(header, pins)
    assert text.splitlines()[-2:] == [
        f"torch==2.14.1+cu130 --hash=sha256:{'b' * 64} --hash=sha256:{'c' * 64}",
        f"zeta==1.0 --hash=sha256:{'a' * 64}",
    ]
    parsed = wl.parse(text)
    assert parsed.header == header
    assert parsed.pins == {p.name: p for p in pins}
    assert wl.render(parsed.header, list(parsed.pins.values())) == text


@pytest.mark.parametrize(("raw", "normal"), [("Foo.Bar_baz", "foo-bar-baz"), ("scikit_learn", "scikit-learn"),
                                             ("PyYAML", "pyyaml"), ("a--b__c", "a-b-c")])
def test_names_are_normalised(raw: str, normal: str) -> None:
    assert wl.normalize(raw) == normal
    assert wl.parse_line(f"{raw}==1 --hash=sha256:{'0' * 64}").name == normal


def test_malformed_and_doubled_lines_name_the_file_and_line() -> None:
    with pytest.raises(wl.LockError, match=r"my\.lock:2: not `name==version --hash=sha256:<hex>`"):
        wl.parse(f"# x: y\nnumpy>=2 --hash=sha256:{'0' * 64}\n", "my.lock")
    with pytest.raises(wl.LockError, match=r"my\.lock:3: numpy is pinned twice"):
        wl.parse(f"numpy==1 --hash=sha256:{'0' * 64}\n\nNumPy==2 --hash=sha256:{'1' * 64}\n", "my.lock")


def test_two_versions_of_one_package_cannot_be_locked(tmp_path: Path) -> None:
    make_wheel(tmp_path, "numpy", "2.4.6")
    make_wheel(tmp_path, "numpy", "2.3.0")
    with pytest.raises(fill.FillError, match=r"two versions of numpy \(numpy-2\.3\.0-py3-none-any\.whl and "
                                             r"numpy-2\.4\.6-py3-none-any\.whl\)"):
        fill.write_lock(str(tmp_path), request())


# --- check -----------------------------------------------------------------------------------


def test_check_passes_on_the_untouched_wheelhouse(house: tuple[Path, Path]) -> None:
    directory, lock = house
    out = check(lock, directory)
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads(out.stdout)
    assert summary["wheels"] == 3
    assert summary["bytes"] == sum(p.stat().st_size for p in directory.glob("*.whl"))


def test_an_altered_byte_is_named_with_file_package_both_hashes_and_what_to_do(house: tuple[Path, Path]) -> None:
    directory, lock = house
    wheel = directory / "beta_thing-2.0-py3-none-any.whl"
    expected = sha256(wheel)
    alter_one_byte(wheel)
    out = check(lock, directory)
    assert out.returncode == 1
    assert out.stdout.splitlines() == [
        f"ALTERED {wheel}: package beta-thing 2.0: expected sha256 {expected}, found sha256 {sha256(wheel)}; "
        f"remove the wheelhouse directory {directory} so that provision.yml downloads it again"
    ]


def test_a_missing_and_an_extra_wheel_are_named(house: tuple[Path, Path]) -> None:
    directory, lock = house
    gone = directory / "gamma-0.3-py3-none-any.whl"
    gone_hash = sha256(gone)
    gone.unlink()
    extra = make_wheel(directory, "delta", "9.9")
    out = check(lock, directory)
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout
    assert lines[0].startswith(f"EXTRA {extra}: package delta 9.9 is not in the lock (the lock has no delta); "
                               f"found sha256 {sha256(extra)}; remove the wheelhouse directory {directory}")
    assert lines[1].startswith(f"MISSING {directory}/gamma-0.3-*.whl: package gamma 0.3 is locked "
                               f"(expected sha256 {gone_hash}) but no wheel of it is in {directory}; remove")


def test_another_version_than_locked_is_extra_and_the_locked_one_missing(house: tuple[Path, Path]) -> None:
    directory, lock = house
    (directory / "gamma-0.3-py3-none-any.whl").unlink()
    make_wheel(directory, "gamma", "0.4")
    lines = check(lock, directory).stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"EXTRA {directory}/gamma-0.4-py3-none-any.whl",
                                                      f"MISSING {directory}/gamma-0.3-*.whl"]
    assert "(the lock pins gamma==0.3)" in lines[0]


def test_an_unreadable_lock_exits_2_naming_it(tmp_path: Path) -> None:
    out = check(tmp_path / "absent.txt", tmp_path)
    assert out.returncode == 2
    assert f"cannot read the lock {tmp_path / 'absent.txt'}" in out.stderr


# --- real pip --------------------------------------------------------------------------------


PYTHONS = [sys.executable] + ([NODE_PYTHON] if subprocess.run(
    [NODE_PYTHON, "-m", "pip", "--version"], capture_output=True, check=False).returncode == 0 else [])


@pytest.mark.parametrize("python", PYTHONS)
def test_pip_installs_the_locked_wheels_and_refuses_an_altered_one(
        python: str, house: tuple[Path, Path], tmp_path: Path) -> None:
    directory, lock = house
    good = pip_install(python, lock, directory, tmp_path / "good")
    assert good.returncode == 0, good.stdout + good.stderr
    assert sorted(p.name for p in (tmp_path / "good").glob("*.py")) == ["alpha_pkg.py", "beta_thing.py", "gamma.py"]

    wheel = directory / "beta_thing-2.0-py3-none-any.whl"
    expected = sha256(wheel)
    alter_one_byte(wheel)
    bad = pip_install(python, lock, directory, tmp_path / "bad")
    assert bad.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in bad.stdout + bad.stderr
    assert not list((tmp_path / "bad").glob("*.py")), "pip installed something from a refused set"

    said = explain(bad.stdout + bad.stderr)
    assert said.returncode == 0
    assert said.stdout.splitlines() == [
        f"REFUSED {wheel.name}: package beta-thing (beta-thing==2.0): expected sha256 {expected}, "
        f"got sha256 {sha256(wheel)}; {wl.DEFAULT_EXPLAIN_HINT}"
    ]


def test_explain_prints_nothing_for_other_failures() -> None:
    said = explain("ERROR: Could not find a version that satisfies the requirement gamma==0.3\n")
    assert (said.returncode, said.stdout) == (1, "")


def test_explain_names_every_refused_wheel_and_all_allowed_hashes() -> None:
    # pip's layout (HashMismatch.body) for two packages, the second with two allowed hashes.
    a, b, c, x, y = ("a" * 64, "b" * 64, "c" * 64, "d" * 64, "e" * 64)
    text = (
        "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have updated ...\n"
        f"    torch==2.14.1 from https://files.example/torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl#sha256={x}"
        " (from -r torchrig-lock.txt (line 9)):\n"
        f"        Expected sha256 {a}\n"
        f"             Got        {x}\n\n"
        "    Scikit_Learn==1.9.1 from file:///var/cache/torchrig/wheelhouse/scikit_learn-1.9.1-cp311.whl"
        " (from -r torchrig-lock.txt (line 3)):\n"
        f"        Expected sha256 {b}\n"
        f"        Expected     or {c}\n"
        f"             Got        {y}\n"
    )
    lines = wl.explain(text, "do X")
    assert lines == [
        f"REFUSED torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl: package torch (torch==2.14.1): "
        f"expected sha256 {a}, got sha256 {x}; do X",
        f"REFUSED scikit_learn-1.9.1-cp311.whl: package scikit-learn (Scikit_Learn==1.9.1): "
        f"expected sha256 {b} or {c}, got sha256 {y}; do X",
    ]


# --- choosing a committed lock ---------------------------------------------------------------


@pytest.fixture
def lock_dir(tmp_path: Path) -> Path:
    """A lock directory holding a copy of the committed lock."""
    directory = tmp_path / "locks"
    directory.mkdir()
    shutil.copy(COMMITTED, directory / COMMITTED.name)
    return directory


def test_the_lock_name_is_stack_and_target() -> None:
    assert fill.lock_name(request()) == "torch2.14.1-cu130-py3.11-x86_64.txt"
    assert fill.lock_name(request(variant="cpu", python="3.12", machine="aarch64")) == \
        "torch2.14.1-cpu-py3.12-aarch64.txt"
    assert fill.lock_name(request(torch=("torch>=2.14", "torchvision"))) is None
    assert fill.lock_name(request(variant="")) is None


def test_the_committed_lock_covers_the_roles_default_request(lock_dir: Path) -> None:
    defaults = yaml.safe_load((ROOT / "roles/pytorch/defaults/main.yml").read_text())
    req = request(deps=tuple(defaults["pytorch_packages"]), nodeps=tuple(defaults["pytorch_nodeps_packages"]))
    path, why = fill.choose_lock(str(lock_dir), req)
    assert path == str(lock_dir / COMMITTED.name), (
        f"{why}: re-pin as roles/pytorch/README.md 'Locked wheels' says")


def test_the_committed_lock_pins_the_full_closure() -> None:
    lock = wl.read(str(COMMITTED))
    assert lock.pins["torch"].version == "2.14.1" and lock.pins["torchvision"].version == "0.29.1"
    # torch's own dependencies and the --nodeps package are pinned too: nodes install with --no-deps.
    assert {"triton", "nvidia-cudnn-cu13", "sympy", "mlxtend", "scikit-learn", "scipy"} <= set(lock.pins)
    assert len(lock.pins) == 58


def test_a_glibc_no_newer_than_the_target_is_covered(lock_dir: Path) -> None:
    path, _ = fill.choose_lock(str(lock_dir), request(glibc="2.39"))
    assert path == str(lock_dir / COMMITTED.name)


def test_specifiers_the_pins_satisfy_are_covered(lock_dir: Path) -> None:
    path, _ = fill.choose_lock(str(lock_dir), request(deps=("numpy>=2", "pyyaml", "tqdm")))
    assert path == str(lock_dir / COMMITTED.name)


@pytest.mark.parametrize(("changes", "why"), [
    ({"deps": ("numpy", "pandas")}, "does not cover this request: it pins no pandas"),
    ({"deps": ("numpy<2",)}, "it pins numpy==2.4.6, which does not satisfy 'numpy<2'"),
    ({"deps": ("mlxtend",), "nodeps": ()}, "mlxtend was locked without its dependencies"),
    ({"deps": ("matplotlib[dev]",)}, "has extras or markers the lock was not resolved for"),
    ({"nodeps": ("mlxtend", "torchmetrics")}, "it pins no torchmetrics"),
    ({"index_url": "https://download.pytorch.org/whl/cu130"},
     "it was made for the index default, not https://download.pytorch.org/whl/cu130"),
    ({"glibc": "2.35"}, "it was made for glibc 2.36, newer than the target's 2.35"),
    ({"python": "3.12"}, "there is no {dir}/torch2.14.1-cu130-py3.12-x86_64.txt"),
    ({"torch": ("torch==2.14.0", "torchvision==0.29.0")}, "there is no {dir}/torch2.14.0-cu130-py3.11-x86_64.txt"),
    ({"variant": "cu128"}, "there is no {dir}/torch2.14.1-cu128-py3.11-x86_64.txt"),
])
def test_a_lock_that_does_not_cover_the_request_is_not_used(lock_dir: Path, changes: dict, why: str) -> None:
    path, said = fill.choose_lock(str(lock_dir), request(**changes))
    assert path is None
    assert why.format(dir=lock_dir) in said


def test_a_lock_renamed_to_another_target_is_not_used(lock_dir: Path) -> None:
    # The header, not only the name, must say the target.
    shutil.copy(COMMITTED, lock_dir / "torch2.14.1-cu130-py3.12-x86_64.txt")
    path, said = fill.choose_lock(str(lock_dir), request(python="3.12"))
    assert path is None
    assert "it was made for python 3.11 on x86_64, not 3.12 on x86_64" in said


# --- fill_wheelhouse end to end, offline (pip reads only a local directory) -----------------


def run_fill(dest: Path, source: Path, lock_dir: Path, deps: tuple[str, ...] = ("alpha-pkg",)
             ) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(FILL), "--dest", str(dest), "--python", HERE_PY, "--machine", HERE_MACHINE,
           "--glibc", HERE_GLIBC, "--index-url", "", "--variant", "cpu", "--lock-dir", str(lock_dir),
           "--torch", "torch==2.14.1", "torchvision==0.29.1", "--deps", *deps, "--nodeps", "gamma"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False,
                          env=pip_env(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(source)))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """What the 'index' offers: a directory pip reads with --find-links."""
    src = tmp_path / "index"
    for dist, version in [("torch", "2.14.1"), ("torchvision", "0.29.1"), ("alpha_pkg", "1.0"), ("gamma", "0.3")]:
        make_wheel(src, dist, version)
    return src


def test_fill_without_a_committed_lock_resolves_and_says_how_to_pin(source: Path, tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    dest = tmp_path / "cache/wheelhouse/row"
    out = run_fill(dest, source, locks)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    name = f"torch2.14.1-cpu-py{HERE_PY}-{HERE_MACHINE}.txt"
    assert result == {"dir": str(dest), "files": 4, "bytes": result["bytes"], "lock": str(dest / wl.LOCK_FILENAME),
                      "pinned_by": None}
    assert (f"locked in {dest / wl.LOCK_FILENAME}; copy it to {locks / name} and commit it to pin this row"
            in out.stderr)
    assert check(dest / wl.LOCK_FILENAME, dest).returncode == 0
    assert sorted(p.name for p in dest.parent.iterdir()) == ["row", "row.lock"]  # no .partial- left


def commit_first_lock(source: Path, tmp_path: Path) -> tuple[Path, str]:
    """Fill once, and commit that fill's lock as the row's: the lock directory and the lock's name."""
    locks = tmp_path / "locks"
    locks.mkdir()
    first = tmp_path / "first"
    assert run_fill(first, source, locks).returncode == 0
    name = f"torch2.14.1-cpu-py{HERE_PY}-{HERE_MACHINE}.txt"
    shutil.copy(first / wl.LOCK_FILENAME, locks / name)
    return locks, name


def test_fill_downloads_exactly_the_committed_lock(source: Path, tmp_path: Path) -> None:
    locks, name = commit_first_lock(source, tmp_path)
    # A later day: the index offers a newer alpha-pkg, which a fresh resolve would take.
    make_wheel(source, "alpha_pkg", "1.1")
    again = tmp_path / "again"
    out = run_fill(again, source, locks)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["pinned_by"] == str(locks / name)
    assert "alpha_pkg-1.0-py3-none-any.whl" in os.listdir(again)
    assert "alpha_pkg-1.1-py3-none-any.whl" not in os.listdir(again)
    assert (again / wl.LOCK_FILENAME).read_bytes() == (locks / name).read_bytes()
    assert check(again / wl.LOCK_FILENAME, again).returncode == 0
    # A request the lock does not cover is resolved afresh (and takes the newer file).
    fresh = tmp_path / "fresh"
    make_wheel(source, "beta.thing", "2.0")
    out = run_fill(fresh, source, locks, deps=("alpha-pkg", "beta.thing"))
    assert out.returncode == 0, out.stderr
    assert f"{locks / name} does not cover this request: it pins no beta-thing" in out.stderr
    assert "alpha_pkg-1.1-py3-none-any.whl" in os.listdir(fresh)


def test_fill_refuses_a_file_that_differs_from_the_committed_lock(source: Path, tmp_path: Path) -> None:
    locks, name = commit_first_lock(source, tmp_path)
    wheel = source / "alpha_pkg-1.0-py3-none-any.whl"
    expected = sha256(wheel)
    alter_one_byte(wheel)  # the index now serves another file under the same name
    dest = tmp_path / "cache/row"
    out = run_fill(dest, source, locks)
    assert out.returncode == 1
    assert out.stdout == ""
    assert f"pip could not download the wheels pinned by {locks / name}" in out.stderr
    assert (f"REFUSED alpha_pkg-1.0-py3-none-any.whl: package alpha-pkg (alpha-pkg==1.0): expected sha256 "
            f"{expected}, got sha256 {sha256(wheel)}") in out.stderr
    assert f"delete {locks / name}, run provision.yml again" in out.stderr
    assert not dest.exists() and [p.name for p in dest.parent.iterdir()] == ["row.lock"]  # complete or absent


def test_fill_reports_no_lock_for_a_wheelhouse_filled_before_locks(tmp_path: Path) -> None:
    old = tmp_path / "old"
    make_wheel(old, "torch", "2.14.1")
    out = subprocess.run([sys.executable, str(FILL), "--dest", str(old), "--python", "3.11", "--machine", "x86_64",
                          "--glibc", "2.36", "--torch", "torch==2.14.1"],
                         capture_output=True, text=True, timeout=60, check=True, env=pip_env())
    assert json.loads(out.stdout)["lock"] is None


# --- two runs filling the same wheelhouse at once (one controller, several clusters) --------


def start_fill(dest: Path, source: Path, lock_dir: Path) -> subprocess.Popen[str]:
    """run_fill, started and not waited for."""
    cmd = [sys.executable, str(FILL), "--dest", str(dest), "--python", HERE_PY, "--machine", HERE_MACHINE,
           "--glibc", HERE_GLIBC, "--index-url", "", "--variant", "cpu", "--lock-dir", str(lock_dir),
           "--torch", "torch==2.14.1", "torchvision==0.29.1", "--deps", "alpha-pkg", "--nodeps", "gamma"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=pip_env(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(source)))


def test_two_first_fills_at_once_both_succeed_with_one_download(source: Path, tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    dest = tmp_path / "cache/wheelhouse/row"
    dest.parent.mkdir(parents=True)
    # The test holds the fill's lock, so both runs are surely there at once.
    with fill.cache_lock.held(str(dest)):
        runs = [start_fill(dest, source, locks) for _ in range(2)]
        with pytest.raises(subprocess.TimeoutExpired):
            runs[0].wait(timeout=2)
        assert runs[1].poll() is None  # both wait for the lock
    outs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outs]
    assert json.loads(outs[0][0]) == json.loads(outs[1][0])
    assert json.loads(outs[0][0])["files"] == 4
    # One downloaded (pip's "Saved ..." lines); the other found its wheelhouse complete.
    assert sorted("Saved " in err for _, err in outs) == [False, True]
    assert check(dest / wl.LOCK_FILENAME, dest).returncode == 0
    assert sorted(p.name for p in dest.parent.iterdir()) == ["row", "row.lock"]  # no .partial- left


def test_the_nodes_platform_gets_pip_flags_for_binary_wheels_of_its_own() -> None:
    # torchrig.cluster's pip_target: what fill_wheelhouse.py and job_venv.py download with.
    args = shared("pip_target").target_args("3.12", "aarch64", "2.39")
    assert args[:5] == ["--only-binary=:all:", "--implementation", "cp", "--python-version", "3.12"]
    platforms = args[6::2]
    assert platforms[0] == "manylinux_2_39_aarch64" and platforms[-1] == "manylinux2014_aarch64"
    assert "manylinux_2_17_aarch64" in platforms and "manylinux_2_16_aarch64" not in platforms
