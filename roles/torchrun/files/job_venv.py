"""A job's own requirements (a script directory's requirements.txt) in a
per-job venv layered on the stack venv, never in the stack venv itself.

Two commands, both printing JSON (roles/torchrun/tasks/requirements.yml):

  STACK/bin/python job_venv.py stack
      on a node, with the stack venv's python: the stack's packages (the
      constraints every job's install runs under), its site-packages and the
      node's Python and platform.

  python job_venv.py download < {"requirements": PATH, "constraints": TEXT,
                                 "python": "3.11", "machine": ..., "glibc": ...,
                                 "cache": DIR}
      on the controller, with the torchrig.cluster collection on PYTHONPATH
      (its cache_lock and pip_target): resolves the requirements against the stack's
      constraints (the place a torch the stack does not have is refused, before
      any node changes) and downloads the wheels the stack does not already have
      into a cache directory keyed by the requirements, the constraints and the
      nodes' platform; once (two runs at once take turns on the directory's
      .lock, and the second uses the first's). Prints {"dir", "key", "files"}
      or {"conflict": MESSAGE}.

The functions are plain, for tests/test_job_venv.py.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

# The .pth file in the job venv's site-packages that layers it on the stack.
PTH_NAME = "torchrig-stack.pth"


def canonical(name):
    """A project name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_freeze(text):
    """{canonical name: version} of `pip list --format=freeze` lines (name==version)."""
    found = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "==" not in line or " @ " in line:
            continue
        name, version = line.split("==", 1)
        found[canonical(name)] = version.strip()
    return found


def constraints_text(packages):
    """One `name==version` line a package, sorted: the stack, pinned.

    The local label (+cpu, +cu126) is left out: `torch==2.14.1` is satisfied by the
    installed 2.14.1+cpu on the node (PEP 440), and on the controller it lets the
    resolver find the version on the index it has (the label's index is the
    stack's business, and whatever of the stack it resolves is not downloaded for
    the nodes anyway)."""
    return "".join(f"{name}=={version.split('+', 1)[0]}\n" for name, version in sorted(packages.items()))


def cache_key(requirements, constraints, python, machine, glibc):
    """The download's cache key: what decides which wheels the nodes get."""
    text = json.dumps([requirements, constraints, python, machine, glibc])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def wheel_project(filename):
    """The canonical project name of a wheel or sdist file name."""
    base = os.path.basename(filename)
    if base.endswith(".whl"):
        return canonical(base.split("-", 1)[0])
    stem = re.sub(r"\.(tar\.gz|zip|tar\.bz2)$", "", base)
    return canonical(stem.rsplit("-", 1)[0])


def drop_stack_files(directory, packages):
    """Removes the files of projects the stack already has; returns what is left."""
    left = []
    for name in sorted(os.listdir(directory)):
        if wheel_project(name) in packages:
            os.remove(os.path.join(directory, name))
        else:
            left.append(name)
    return left


def stack_state():
    """Run with the stack venv's python on a node."""
    import importlib.metadata
    import platform

    packages = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            packages[canonical(name)] = dist.version
    return {
        "packages": packages,
        "constraints": constraints_text(packages),
        "purelib": sysconfig.get_path("purelib"),
        "python": "{}.{}".format(*sys.version_info[:2]),
        "machine": platform.machine(),
        "glibc": platform.libc_ver()[1],
    }


def stack_state_of(python):
    """stack_state() as another python (a stack venv's) reports it: what the role runs."""
    out = subprocess.run([python, os.path.abspath(__file__), "stack"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def pth_line(stack_purelib):
    """The .pth file's content: the stack's site-packages, after the job venv's own.

    Why not `python -m venv --system-site-packages`: made from the stack venv's
    python, such a venv reads the BASE interpreter's site-packages (/usr/lib/
    python3/dist-packages), not the stack venv's, so neither torch nor torchrig
    would import. site.py appends each line of a .pth file to sys.path after the
    directory holding it: the job's packages come first, the stack's next."""
    return stack_purelib + "\n"


_CAUSE = re.compile(r"^\s*(?P<who>.+?) (?:requested|depends on) (?P<what>.+?)\s*$")


def conflict_lines(pip_output):
    """The lines under pip's "The conflict is caused by:" (ResolutionImpossible)."""
    lines, inside = [], False
    for line in pip_output.splitlines():
        if "The conflict is caused by:" in line:
            inside = True
            continue
        if inside:
            if not line.strip():
                if lines:
                    break
                continue
            lines.append(line.strip())
    return lines


def requirement_name(text):
    """The canonical project name at the start of a requirement string."""
    found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", text)
    return canonical(found.group(1)) if found else ""


def conflict_message(pip_output, packages, requirements_path, node):
    """The message for a requirement the stack cannot meet, or None if pip's output is
    not a resolution conflict with the stack."""
    causes = conflict_lines(pip_output)
    if not causes:
        return None
    pinned, asked = [], []
    for line in causes:
        cause = _CAUSE.match(line)
        if not cause:
            continue
        if "(constraint)" in cause.group("who") or line.startswith("The user requested (constraint)"):
            what = line.split("(constraint)", 1)[1].strip()
            pinned.append(requirement_name(what))
        else:
            asked.append(line.replace("The user requested ", "it asks for "))
    names = [name for name in dict.fromkeys(pinned) if name in packages]
    if not names:
        return None
    stack = ", ".join(f"{name} {packages[name]}" for name in names)
    torch_hint = (
        " For another torch, run the job on nodes provisioned with a matrix row that has it "
        "(torchrig_torch, then provision.yml)." if {"torch", "torchvision"} & set(names) else ""
    )
    return (
        f"{requirements_path}: {'; '.join(asked) or 'its requirements need another version'}, "
        f"but the stack on {node} has {stack}. A job's own requirements are installed beside the stack "
        f"and never change it: remove {' and '.join(names)} from requirements.txt (the stack's "
        f"{'is' if len(names) == 1 else 'are'} there for the job) or accept the stack's version.{torch_hint} "
        "Nothing was changed on the nodes; no job was started."
    )


def _pip_fetch(pip, pins, dest, index, target):
    """Wheels for exact pins, without dependencies (the resolution was done already)."""
    if not pins:
        return
    if target:  # another platform: wheels only (target_args says --only-binary)
        cmd = pip + ["download", "--no-deps", "--dest", dest] + index + target + pins
    else:  # this platform: `pip wheel` also builds a wheel of a package that has only an sdist
        cmd = pip + ["wheel", "--no-deps", "--wheel-dir", dest] + index + pins
    subprocess.run(cmd, check=True, stdout=sys.stderr)


def download(request):
    """The controller's step: resolve, then fetch what the stack lacks, once per key."""
    with open(request["requirements"]) as f:
        requirements = f.read()
    constraints = request["constraints"]
    packages = parse_freeze(constraints)
    installed = {canonical(k): v for k, v in request.get("packages", packages).items()}  # with local labels
    key = cache_key(requirements, constraints, request["python"], request["machine"], request["glibc"])
    dest = os.path.join(request["cache"], key)
    from ansible_collections.torchrig.cluster.plugins.module_utils import cache_lock
    from ansible_collections.torchrig.cluster.plugins.module_utils.pip_target import target_args

    # Runs for other clusters may fill dest at the same moment: one at a time,
    # and one that waited finds dest made and uses it.
    with cache_lock.held(dest):
        if not os.path.isdir(dest):
            extra = target_args(request["python"], request["machine"], request["glibc"])
            os.makedirs(request["cache"], exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=".partial-", dir=request["cache"])
            try:
                cons = os.path.join(tmp, "constraints.txt")
                with open(cons, "w") as f:
                    f.write(constraints)
                report = os.path.join(tmp, "report.json")
                wheels = os.path.join(tmp, "wheels")
                pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
                index = list(request.get("pip_args", []))  # e.g. --no-index --find-links DIR
                # Resolve against the stack's constraints without downloading: a
                # requirement the stack cannot meet stops here, named.
                # (--target: pip takes the nodes' platform flags for a dry run only with it.)
                resolve = subprocess.run(
                    pip + ["install", "--dry-run", "--ignore-installed", "--report", report, "--target",
                           os.path.join(tmp, "target"), "-r", request["requirements"], "-c", cons] + index + extra,
                    check=False, capture_output=True, text=True)
                if resolve.returncode != 0:
                    message = conflict_message(resolve.stdout + resolve.stderr, installed,
                                               request.get("label", "requirements.txt"),
                                               request.get("node", "the nodes"))
                    return {"conflict": message or "pip could not resolve the job's requirements.txt:\n"
                            + (resolve.stderr or resolve.stdout).strip()[-3000:], "key": key}
                with open(report) as f:
                    chosen = [item["metadata"] for item in json.load(f)["install"]]
                # What the stack has is there on the node already: not fetched, not pushed.
                pins = sorted(f"{meta['name']}=={meta['version']}" for meta in chosen
                              if canonical(meta["name"]) not in packages)
                os.makedirs(wheels)
                _pip_fetch(pip, pins, wheels, index, extra)
                drop_stack_files(wheels, packages)
                os.rename(wheels, dest)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    files = sorted(os.listdir(dest))
    return {"dir": dest, "key": key, "files": files}


def main(argv):
    if argv[1:2] == ["stack"]:
        return stack_state()
    if argv[1:2] == ["download"]:
        return download(json.load(sys.stdin))
    raise SystemExit(__doc__)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv)))
