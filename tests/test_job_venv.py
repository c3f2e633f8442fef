"""roles/torchrun/files/job_venv.py: a job's requirements.txt in its own venv,
layered on the stack venv. Real pip throughout, on small wheels made here (no
index, no network): the resolution against the stack's constraints, the
conflict message from pip's own ResolutionImpossible output, the download
cache, and the .pth layering in real venvs."""

import base64
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import zipfile

import pytest
from rolepy import COLLECTIONS, load, shared

jv = load("roles/torchrun/files/job_venv.py", "job_venv")


@pytest.fixture(autouse=True)
def plain_pip(monkeypatch):
    """pip without this machine's config (its find-links, index and constraints)."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in list(os.environ):
        if name.startswith("PIP_") and name != "PIP_CONFIG_FILE":
            monkeypatch.delenv(name)
    # job_venv.py download, run as the torchrun role runs it: the collection on its path.
    monkeypatch.setenv("PYTHONPATH", COLLECTIONS)


def make_wheel(directory, name, version, requires=(), module=None):
    """A pure-Python wheel; its module records its own version."""
    dist = f"{name.replace('-', '_')}-{version}"
    module = module or name.replace("-", "_")
    files = {
        f"{module}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    path = os.path.join(directory, f"{dist}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        for name_, text in files.items():
            z.writestr(name_, text)
        z.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture
def index(tmp_path):
    """A find-links directory: a stack's torch and numpy (and another torch), and
    packages a job might want."""
    d = tmp_path / "index"
    d.mkdir()
    make_wheel(d, "torch", "2.14.1", ["numpy"])
    make_wheel(d, "torch", "2.13.0", ["numpy"])
    make_wheel(d, "numpy", "2.4.6")
    make_wheel(d, "einops", "0.8.2")
    make_wheel(d, "tomli-w", "1.2.0")
    make_wheel(d, "needs-old-torch", "1.0", ["torch<2.14"])
    make_wheel(d, "uses-torch", "1.0", ["torch>=2.0", "einops"])
    return d


STACK = "torch==2.14.1\nnumpy==2.4.6\n"


def download(tmp_path, index, requirements, constraints=STACK, packages=None):
    req = tmp_path / "requirements.txt"
    req.write_text(requirements)
    request = {"requirements": str(req), "constraints": constraints, "label": "ddp/requirements.txt",
               "node": "node1",
               "packages": packages or {"torch": "2.14.1+cpu", "numpy": "2.4.6"},
               "cache": str(tmp_path / "cache"),
               "pip_args": ["--no-index", "--find-links", str(index)],
               # this machine's: target_args adds nothing
               "python": "{}.{}".format(*sys.version_info[:2]), "machine": os.uname().machine,
               "glibc": __import__("platform").libc_ver()[1]}
    return jv.download(request)


# --- the stack's constraints ---------------------------------------------------

def test_constraints_pin_every_stack_package_without_its_local_label():
    freeze = ("# a comment\nTorch==2.14.1+cpu\nnumpy==2.4.6\nPyYAML==6.0.2\n"
              "-e git+https://x/y#egg=z\nfoo @ file:///w.whl\n")
    packages = jv.parse_freeze(freeze)
    assert packages == {"torch": "2.14.1+cpu", "numpy": "2.4.6", "pyyaml": "6.0.2"}
    assert jv.constraints_text(packages) == "numpy==2.4.6\npyyaml==6.0.2\ntorch==2.14.1\n"


def test_the_stack_state_lists_this_pythons_packages():
    state = jv.stack_state()
    assert state["packages"]["pytest"] == __import__("importlib.metadata").metadata.version("pytest")
    assert f"pytest=={state['packages']['pytest']}\n" in state["constraints"]
    assert state["purelib"] == sysconfig.get_path("purelib")


def test_the_cache_key_follows_the_requirements_the_stack_and_the_platform():
    key = jv.cache_key("einops\n", STACK, "3.11", "x86_64", "2.36")
    assert key == jv.cache_key("einops\n", STACK, "3.11", "x86_64", "2.36")
    assert len({key, jv.cache_key("einops==0.8\n", STACK, "3.11", "x86_64", "2.36"),
                jv.cache_key("einops\n", STACK.replace("2.14.1", "2.15.0"), "3.11", "x86_64", "2.36"),
                jv.cache_key("einops\n", STACK, "3.12", "x86_64", "2.36"),
                jv.cache_key("einops\n", STACK, "3.11", "aarch64", "2.36")}) == 5


def test_wheel_and_sdist_names_give_the_project():
    assert jv.wheel_project("tomli_w-1.2.0-py3-none-any.whl") == "tomli-w"
    assert jv.wheel_project("torch-2.14.1+cpu-cp311-cp311-manylinux_2_28_x86_64.whl") == "torch"
    assert jv.wheel_project("Some.Package-1.0.tar.gz") == "some-package"


# --- the controller's resolution and download ----------------------------------

def test_another_torch_is_refused_with_the_stacks_version_and_what_to_do(tmp_path, index):
    found = download(tmp_path, index, "einops\ntorch==2.13.0\n")
    assert found["conflict"] == (
        "ddp/requirements.txt: it asks for torch==2.13.0, but the stack on node1 has torch "
        "2.14.1+cpu. A job's own requirements are installed beside the stack and never change it: remove torch "
        "from requirements.txt (the stack's is there for the job) or accept the stack's version. For another "
        "torch, run the job on nodes provisioned with a matrix row that has it (torchrig_torch, then "
        "provision.yml). Nothing was changed on the nodes; no job was started.")
    assert os.listdir(tmp_path / "cache") == [found["key"] + ".lock"]  # nothing kept but the lock file


def test_a_dependency_that_needs_another_torch_is_named(tmp_path, index):
    found = download(tmp_path, index, "needs-old-torch\n")
    assert "needs-old-torch 1.0 depends on torch<2.14, but the stack on node1 has torch 2.14.1" in found["conflict"]


def test_a_conflict_outside_the_stack_is_pips_own_message(tmp_path, index):
    found = download(tmp_path, index, "einops==9.9\n")
    assert found["conflict"].startswith("pip could not resolve the job's requirements.txt:")
    assert "einops==9.9" in found["conflict"]


def test_only_what_the_stack_lacks_is_downloaded_once(tmp_path, index):
    found = download(tmp_path, index, "uses-torch\ntomli-w\ntorch\n")
    assert found["files"] == ["einops-0.8.2-py3-none-any.whl", "tomli_w-1.2.0-py3-none-any.whl",
                              "uses_torch-1.0-py3-none-any.whl"]
    assert found["dir"] == str(tmp_path / "cache" / found["key"])
    # Cached: a second run finds the directory and runs no pip (the index is gone).
    for wheel in index.iterdir():
        wheel.unlink()
    assert download(tmp_path, index, "uses-torch\ntomli-w\ntorch\n") == found
    assert sorted(os.listdir(tmp_path / "cache")) == [found["key"], found["key"] + ".lock"]


def test_two_runs_downloading_the_same_requirements_at_once_both_succeed(tmp_path, index):
    # Two clusters (or molecule scenarios) starting the same job from one controller.
    req = tmp_path / "requirements.txt"
    req.write_text("uses-torch\ntomli-w\n")
    request = {"requirements": str(req), "constraints": STACK, "cache": str(tmp_path / "cache"),
               "pip_args": ["--no-index", "--find-links", str(index)],
               "python": "{}.{}".format(*sys.version_info[:2]), "machine": os.uname().machine,
               "glibc": __import__("platform").libc_ver()[1]}
    key = jv.cache_key(req.read_text(), STACK, request["python"], request["machine"], request["glibc"])
    cache_lock = shared("cache_lock")
    with cache_lock.held(str(tmp_path / "cache" / key)):  # both runs are surely there at once
        runs = [subprocess.Popen([sys.executable, jv.__file__, "download"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        for run in runs:
            run.stdin.write(json.dumps(request))
            run.stdin.close()
        with pytest.raises(subprocess.TimeoutExpired):
            runs[0].wait(timeout=2)
        assert runs[1].poll() is None
    outs = [(run.stdout.read(), run.stderr.read(), run.wait(timeout=120)) for run in runs]
    assert [rc for _, _, rc in outs] == [0, 0], [err for _, err, _ in outs]
    assert json.loads(outs[0][0]) == json.loads(outs[1][0])
    assert json.loads(outs[0][0])["files"] == ["einops-0.8.2-py3-none-any.whl", "tomli_w-1.2.0-py3-none-any.whl",
                                                "uses_torch-1.0-py3-none-any.whl"]
    assert sorted(os.listdir(tmp_path / "cache")) == [key, key + ".lock"]  # no .partial- left


def test_the_conflict_parser_reads_pips_lines():
    output = ("ERROR: Cannot install torch==2.13.0 because these package versions have conflicting dependencies.\n\n"
              "The conflict is caused by:\n    The user requested torch==2.13.0\n"
              "    The user requested (constraint) torch==2.14.1\n\nTo fix this you could try to:\n1. loosen\n")
    assert jv.conflict_lines(output) == ["The user requested torch==2.13.0",
                                         "The user requested (constraint) torch==2.14.1"]
    assert jv.conflict_message("ERROR: No matching distribution found for x\n", {}, "r", "n") is None


# --- the job venv on the stack venv --------------------------------------------

def run(*argv):
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def pip_into(python, *args):
    """This interpreter's pip, installing into another venv (as the stack's pip does on the nodes)."""
    return run(sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", python, "install",
               "--no-index", *args)


def purelib(venv):
    return run(os.path.join(venv, "bin", "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")


@pytest.fixture
def stack(tmp_path, index):
    """A stack venv with torch 2.14.1 and numpy."""
    venv = str(tmp_path / "stack")
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    pip_into(os.path.join(venv, "bin", "python"), "--find-links", str(index), "torch==2.14.1")
    return venv


def test_system_site_packages_of_a_venv_made_from_a_venv_is_not_the_stack(tmp_path, stack):
    job = str(tmp_path / "sys")
    run(os.path.join(stack, "bin", "python"), "-m", "venv", "--without-pip", "--system-site-packages", job)
    found = subprocess.run([os.path.join(job, "bin", "python"), "-c", "import torch"],
                           check=False, capture_output=True, text=True)
    assert "No module named 'torch'" in found.stderr


def test_the_job_venv_sees_its_packages_first_then_the_stacks(tmp_path, index, stack):
    job = str(tmp_path / "job")
    stack_python = os.path.join(stack, "bin", "python")
    run(stack_python, "-m", "venv", "--without-pip", job)
    with open(os.path.join(purelib(job), jv.PTH_NAME), "w") as f:
        f.write(jv.pth_line(purelib(stack)))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "einops", "0.8.2")
    make_wheel(wheels, "numpy", "9.0")  # a numpy the stack does not have, offered to the job
    req = tmp_path / "requirements.txt"
    req.write_text("einops\nnumpy\ntorch\n")
    cons = tmp_path / "constraints.txt"
    cons.write_text(jv.constraints_text(jv.stack_state_of(stack_python)["packages"]))
    out = pip_into(os.path.join(job, "bin", "python"), "--find-links", str(wheels), "-r", str(req), "-c", str(cons))
    # The stack's packages satisfy the requirements through the .pth file:
    # nothing of the stack is installed again, its numpy is kept.
    assert "Successfully installed einops-0.8.2" in out
    assert sorted(p for p in os.listdir(purelib(job)) if not p.startswith("_")) == [
        "einops", "einops-0.8.2.dist-info", jv.PTH_NAME]
    probe = ("import sys, einops, torch, numpy; print(einops.__file__); print(torch.__file__);"
             f"print(numpy.__version__); print(sys.path.index({purelib(job)!r}) < sys.path.index({purelib(stack)!r}))")
    lines = run(os.path.join(job, "bin", "python"), "-c", probe).splitlines()
    assert lines[0].startswith(purelib(job))
    assert lines[1].startswith(purelib(stack))
    assert lines[2:] == ["2.4.6", "True"]
    # The stack venv is unchanged.
    assert "einops" not in os.listdir(purelib(stack))


def test_a_second_torch_cannot_get_into_the_job_venv_on_the_node(tmp_path, index, stack):
    """Even with that torch's wheel pushed, the node's install under the constraints refuses it."""
    job = str(tmp_path / "job")
    run(os.path.join(stack, "bin", "python"), "-m", "venv", "--without-pip", job)
    with open(os.path.join(purelib(job), jv.PTH_NAME), "w") as f:
        f.write(jv.pth_line(purelib(stack)))
    cons = tmp_path / "constraints.txt"
    cons.write_text(STACK)
    found = subprocess.run([sys.executable, "-m", "pip", "--python", os.path.join(job, "bin", "python"), "install",
                            "--no-index", "--find-links", str(index), "torch==2.13.0", "-c", str(cons)],
                           check=False, capture_output=True, text=True)
    assert found.returncode != 0 and "ResolutionImpossible" in found.stderr
    assert json.loads(run(os.path.join(job, "bin", "python"), "-c",
                          "import json, torch; print(json.dumps(torch.__version__))")) == "2.14.1"
