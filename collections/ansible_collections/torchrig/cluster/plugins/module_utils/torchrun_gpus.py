"""Which GPUs of a node each job holds, which a new job gets, and the GPU queue.

Nothing is booked anywhere: the GPUs held on a node are read from what systemd says runs.
Each job's unit reads its GPUs from `<config_dir>/<job>.gpus` (an EnvironmentFile written
just before the unit starts); the GPUs held are those files' of the units that systemd
reports running. A job that ends, fails or is stopped frees its GPUs at once, and after a
reboot only the units that run again hold any.

The controller's choice is made from what ran when train.yml looked; two train.yml runs
started at once both saw the same GPUs free. So each GPU job's unit claims its GPUs as it
starts (`claim`, its ExecStartPre, as root), one unit at a time under a lock of the node's:
GPUs another running job took meanwhile are swapped for free ones, and where too few are
left the start is refused with the reason in `<job>.refused`.

One file, used four ways: the torchrun role's modules and its filter plugin import it
(torchrig.cluster's module_utils), and on each node (as root, with the system's python3)
the queue runner (torchrig-queue.service) and each GPU job's claim run it as a script
(the torchrun_gpus_runner lookup gives its text). Standard library only, no Ansible
import: tests import it directly.

Whatever a node says is untrusted input for the controller: unit names and file contents
are checked where they are read (job names by pattern, GPU lists as whole numbers).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

# A job's name, as torchrig_job_name_pattern says (it names the unit and the files).
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
UNIT = "torchrig-job@{}.service"
# The queue's timer (tasks/queue.yml): it runs only while the queue holds a job.
TIMER = "torchrig-queue.timer"
# Where the loaded NVIDIA driver lists the GPUs it sees, one directory each.
NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"
# systemd's ActiveState values of a job unit that holds (or is about to hold, or still
# holds) the job's processes, hence its GPUs: such a job counts as running.
RUNNING_STATES = ("active", "activating", "deactivating", "reloading")
# SubStates of a running unit that may not have claimed its GPUs yet (see _holds).
CLAIMING_STATES = ("start-pre", "auto-restart")
GPU_LIST = re.compile(r"(?:[0-9]{1,3}(?:,[0-9]{1,3})*)?")
# Held while a unit claims its GPUs (claim()): one claim at a time per node.
LOCK = "/run/torchrig-gpus.lock"
# A queue entry's file name: the controller's submit time (ns), then the job.
ENTRY = re.compile(r"([0-9]{1,20})-([A-Za-z0-9][A-Za-z0-9._-]{0,63})\.json")


class GpuError(ValueError):
    """A job that does not fit the GPUs free on a node. Not Ansible's own error class: tests
    import this without Ansible."""


# ------------------------------------------------------------------ reading a node


def parse_env(text: str) -> dict[str, str]:
    """KEY=VALUE lines of an EnvironmentFile; comments and other lines are skipped."""
    out = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip().strip('"')
    return out


def parse_gpus(value: str) -> list[int]:
    """'0,1' as [0, 1]; '' as []. Anything else is not a GPU list: ValueError."""
    if not GPU_LIST.fullmatch(value or ""):
        raise ValueError(f"not a GPU list: {value[:40]!r}")
    return sorted({int(g) for g in value.split(",")}) if value else []


def parse_show(text: str) -> dict[str, dict[str, str]]:
    """`systemctl show -p Id,...` of several units: {unit: {property: value}}."""
    units: dict[str, dict[str, str]] = {}
    for block in re.split(r"\n\s*\n", text):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("Id"):
            units[props["Id"]] = props
    return units


def job_names(config_dir: str) -> list[str]:
    """The jobs that have settings on this node (`<job>.env`), by name; other files skipped."""
    try:
        names = os.listdir(config_dir)
    except OSError:
        return []
    return sorted(n[:-4] for n in names if n.endswith(".env") and JOB_NAME.fullmatch(n[:-4]))


def started_at(monotonic_us: str, now: float, mono_now: float) -> int:
    """Unix time from systemd's ActiveEnterTimestampMonotonic (µs since boot); 0 for never.
    Monotonic, not the wall-clock string: its format differs between systemd versions."""
    if not str(monotonic_us).isdigit() or int(monotonic_us) == 0:
        return 0
    return int(now - (mono_now - int(monotonic_us) / 1e6))


Run = Callable[[list[str]], str]


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read(65536)
    except OSError:
        return ""


def node_jobs(config_dir: str, gpus_name: str, run: Run = _run, now: float | None = None,
              mono_now: float | None = None) -> list[dict[str, Any]]:
    """Every job with settings on this node: {job, state, running, since, gpus}.

    `state` is systemd's ActiveState/SubState, `since` when the unit last became active
    (Unix time, 0 for never), `gpus` the GPUs it holds: those of its .gpus file while
    systemd says it runs, else none. This is the one answer to "which jobs run on this
    node" (status.yml, train.yml's GPU choice, a drain)."""
    jobs = job_names(config_dir)
    if not jobs:
        return []
    now = time.time() if now is None else now
    mono_now = time.monotonic() if mono_now is None else mono_now
    shown = parse_show(run(["systemctl", "show",
                            "--property=Id,ActiveState,SubState,ActiveEnterTimestampMonotonic,InvocationID",
                            *[UNIT.format(j) for j in jobs]]))
    out = []
    for job in jobs:
        props = shown.get(UNIT.format(job), {})
        active, sub = props.get("ActiveState", "inactive"), props.get("SubState", "dead")
        running = active in RUNNING_STATES
        try:
            gpus = parse_gpus(parse_env(_read(os.path.join(config_dir, f"{job}.gpus"))).get(gpus_name, ""))
        except ValueError:
            gpus = []
        out.append({"job": job, "state": f"{active}/{sub}", "running": running,
                    "since": started_at(props.get("ActiveEnterTimestampMonotonic", "0"), now, mono_now),
                    "gpus": gpus if running and _holds(config_dir, job, sub, props.get("InvocationID", "")) else []})
    return out


def _holds(config_dir: str, job: str, sub: str, invocation: str) -> bool:
    """Whether a unit that systemd says runs holds its GPUs. Not before its claim has taken
    them: a unit in ExecStartPre (start-pre) may still wait for the node's lock, and one
    waiting to restart (auto-restart) may have been refused; either holds them only where
    `<job>.claimed` names its current invocation. Counted as holding, two units starting at
    once each saw the other's and both were refused."""
    if sub not in CLAIMING_STATES:
        return True
    return bool(invocation) and _read(os.path.join(config_dir, f"{job}.claimed")).strip() == invocation


def job_running(active_state: str | None, ended: dict) -> bool:
    """Whether this node's part of a job still runs.

    A part that has ended for good (`ended`: one of the contract's end files) is over even
    while systemd is still stopping its unit: the stop waits for every process of the
    unit to go, up to TimeoutStopSec (120 s), and was seen to wait that long after the
    job had ended and written why.
    """
    return active_state in RUNNING_STATES and not ended


def count_gpus(gpus_dir: str = NVIDIA_GPUS_DIR) -> int:
    """GPUs the loaded NVIDIA driver sees: one directory per GPU (by PCI address)."""
    try:
        return len([e for e in os.scandir(gpus_dir) if e.is_dir()])
    except OSError:
        return 0


# ------------------------------------------------------------------ the choice


def _when(since: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if since else "a moment ago"


def holders(jobs: Iterable[Mapping[str, Any]], job: str = "") -> list[Mapping[str, Any]]:
    """The running jobs other than `job` that hold GPUs, oldest first."""
    return sorted((j for j in jobs if j.get("running") and j.get("gpus") and j.get("job") != job),
                  key=lambda j: (j.get("since", 0), j.get("job", "")))


def held_by(jobs: Iterable[Mapping[str, Any]], job: str) -> str:
    """'job a holds GPU 0 since ...; job b holds ...': who holds the GPUs job cannot have."""
    return "; ".join(f"job {j['job']} holds GPU {','.join(map(str, j['gpus']))} since {_when(int(j.get('since', 0)))}"
                     for j in holders(jobs, job))


def free_gpus(total: int, jobs: Iterable[Mapping[str, Any]], job: str = "") -> list[int]:
    """The GPUs 0..total-1 that no other running job holds."""
    held = {int(g) for j in holders(jobs, job) for g in j["gpus"]}
    return [g for g in range(int(total)) if g not in held]


def wanted(want: Any, total: int) -> int:
    """-e gpus: a whole number >= 1, or 0/'all'/None for every GPU of the node."""
    text = str(want).strip().lower() if want is not None else "all"
    if text in ("all", "0", ""):
        return int(total)
    if not text.isdigit():
        raise GpuError(f"gpus must be a whole number of GPUs per node from 1, or all; got {want!r}.")
    return int(text)


def choose(total: int, jobs: Sequence[Mapping[str, Any]], want: Any, job: str, host: str) -> list[int]:
    """The GPUs job `job` gets on `host`: the lowest-numbered free ones. GpuError, naming the
    jobs that hold the others and when each started, when too few are free."""
    need = wanted(want, total)
    if need > int(total):
        raise GpuError(f"Job {job} asks for {need} GPUs per node (gpus={want}) but {host} has {total}. "
                       "Ask for fewer with -e gpus=N. No job was started.")
    free = free_gpus(total, jobs, job)
    if need <= len(free):
        return free[:need]
    held = held_by(jobs, job)
    raise GpuError(
        f"Job {job} asks for {need} GPUs per node but {host} has {len(free)} of {total} free ({held}). "
        "Wait for one of them to end, stop one with playbooks/stop.yml -e job=NAME, ask for fewer with "
        "-e gpus=N, or queue the job with -e queue=true (it starts by itself when the GPUs free). "
        "No job was started.")


def choice(total: int, jobs: Sequence[Mapping[str, Any]], want: Any, job: str, host: str) -> dict[str, Any]:
    """choose() for a template: {gpus: [...], problem: ''} or {gpus: [], problem: message}."""
    try:
        return {"gpus": choose(total, jobs, want, job, host), "problem": ""}
    except GpuError as e:
        return {"gpus": [], "problem": str(e)}


def gpus_env(gpus: Sequence[int], nproc: int, names: Mapping[str, str]) -> str:
    """The .gpus EnvironmentFile: the GPUs held (by PCI bus order, which is the order of
    the driver's /proc listing), and one process per GPU unless the job set its own."""
    listed = ",".join(str(int(g)) for g in gpus)
    lines = ["# The GPUs this job holds on this node (written when it starts; read by torchrig's GPU choice).",
             f"{names['gpus']}={listed}",
             # CUDA numbers GPUs fastest first by default; the driver lists them by PCI address.
             "CUDA_DEVICE_ORDER=PCI_BUS_ID",
             f"CUDA_VISIBLE_DEVICES={listed}"]
    if int(nproc) == 0:
        lines.append(f"{names['nproc_per_node']}={max(len(gpus), 1)}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the claim at start


def claim(job: str, config_dir: str, gpus_dir: str, names: Mapping[str, str], run: Run = _run,
          lock: str = LOCK, invocation: str = "") -> str:
    """Make job's GPUs on this node its own as its unit starts; returns what was done.

    Under the node's lock, so that two units starting at once claim one after the other: the
    first is then `activating` with its GPUs, which the second sees. GPUs that another running
    job holds are swapped for free ones (the same number); GpuError, its message also in
    `<job>.refused`, when too few are free. A job without a .gpus file (CPU, or not a job of
    torchrig's GPU choice) claims nothing. `invocation` is the unit's InvocationID (systemd's
    $INVOCATION_ID), written to `<job>.claimed` once the GPUs are taken."""
    gpus_file = os.path.join(config_dir, f"{job}.gpus")
    refused = os.path.join(config_dir, f"{job}.refused")
    claimed = os.path.join(config_dir, f"{job}.claimed")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = _read(gpus_file)
        if not text:
            return f"job {job} holds no GPUs here"
        env = parse_env(text)
        mine = parse_gpus(env.get(names["gpus"], ""))
        jobs = node_jobs(config_dir, names["gpus"], run)
        total = count_gpus(gpus_dir)
        free = free_gpus(total, jobs, job)
        _remove(claimed)
        if len(mine) > len(free):
            message = (f"Job {job} asks for {len(mine)} GPUs per node but {len(free)} of the {total} here "
                       f"are free as it starts: another job started at the same time took them "
                       f"({held_by(jobs, job)}). Start it again, or queue it with -e queue=true.")
            _write(refused, message + "\n", gpus_file)
            raise GpuError(message)
        done = f"job {job} holds GPU {','.join(map(str, mine))} here"
        taken = sorted(set(mine) - set(free))
        if taken:
            mine = free[:len(mine)]
            # The nproc line is in the file only where the job runs one process per GPU.
            _write(gpus_file, gpus_env(mine, 0 if names["nproc_per_node"] in env else 1, names), gpus_file)
            done = (f"job {job} holds GPU {','.join(map(str, mine))} here: GPU {','.join(map(str, taken))} "
                    "went to another job that started at the same time")
        _remove(refused)
        _write(claimed, invocation + "\n", gpus_file)
        return done
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# ------------------------------------------------------------------ the queue


def queue_entries(queue_dir: str) -> list[dict[str, Any]]:
    """The queue's entries here, first come first: {at, job, want, nproc, gpus_dir}. An entry
    whose name or content is not one is skipped."""
    try:
        names = os.listdir(queue_dir)
    except OSError:
        return []
    out = []
    for name in names:
        m = ENTRY.fullmatch(name)
        if not m:
            continue
        try:
            data = json.loads(_read(os.path.join(queue_dir, name)) or "null")
            entry = {"at": int(m[1]), "job": m[2], "want": int(data["want"]), "nproc": int(data.get("nproc", 0)),
                     "gpus_dir": str(data["gpus_dir"]), "file": name}
        except (ValueError, TypeError, KeyError):
            continue
        out.append(entry)
    return sorted(out, key=lambda e: (e["at"], e["job"]))


def _write(path: str, text: str, group_of: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    st = os.stat(group_of)
    os.chown(tmp, 0, st.st_gid)
    os.chmod(tmp, 0o640)
    os.replace(tmp, path)


def run_queue(queue_dir: str, config_dir: str, names: Mapping[str, str], run: Run = _run) -> list[str]:
    """Start the queued jobs whose GPUs are free here, first come first: the first entry that
    does not fit stops the round, so a later, smaller job never passes it. Returns the jobs
    started. A job whose unit already runs (started by train.yml) just leaves the queue."""
    started = []
    for entry in queue_entries(queue_dir):
        jobs = node_jobs(config_dir, names["gpus"], run)
        this = next((j for j in jobs if j["job"] == entry["job"]), None)
        path = os.path.join(queue_dir, entry["file"])
        if this is None or this["running"]:
            os.unlink(path)
            continue
        total = count_gpus(entry["gpus_dir"])
        free = free_gpus(total, jobs, entry["job"])
        if entry["want"] > len(free):
            break
        env = os.path.join(config_dir, f"{entry['job']}.env")
        _write(os.path.join(config_dir, f"{entry['job']}.gpus"), gpus_env(free[:entry["want"]], entry["nproc"], names),
               env)
        run(["systemctl", "enable", "--now", UNIT.format(entry["job"])])
        if os.path.exists(os.path.join(config_dir, f"{entry['job']}.refused")):
            # A train.yml start took the GPUs between this look and the unit's claim: the
            # entry stays, and the unit does not retry by itself (Restart=) before its turn.
            run(["systemctl", "disable", "--now", UNIT.format(entry["job"])])
            break
        os.unlink(path)
        started.append(entry["job"])
    return started


def stop_timer_when_empty(queue_dir: str, run: Run = _run) -> bool:
    """Stop the queue's timer once the queue is empty, and say whether it stopped.

    A timer left running with nothing to do would add a journal line every few seconds for
    as long as the node runs. train.yml starts it again after it writes an entry; an entry
    written while this runs is seen by the second look, which starts the timer again."""
    if queue_entries(queue_dir):
        return False
    run(["systemctl", "stop", TIMER])
    if queue_entries(queue_dir):
        run(["systemctl", "start", TIMER])
        return False
    return True


def main(argv: Sequence[str], run: Run = _run, lock: str = LOCK) -> int:
    """torchrig-queue.service: `torchrun_gpus.py QUEUE_DIR CONFIG_DIR GPUS_NAME NPROC_NAME` (the
    job contract's names of the GPU list and of the processes per node).
    A GPU job's ExecStartPre: `torchrun_gpus.py claim JOB CONFIG_DIR GPUS_DIR GPUS_NAME NPROC_NAME`."""
    if argv[0] == "claim":
        job, config_dir, gpus_dir = argv[1], argv[2], argv[3]
        if not JOB_NAME.fullmatch(job):
            print(f"torchrig GPUs: not a job name: {job[:80]!r}", file=sys.stderr)
            return 2
        names = {"gpus": argv[4], "nproc_per_node": argv[5]}
        invocation = os.environ.get("INVOCATION_ID", "")
        try:
            print("torchrig GPUs:", claim(job, config_dir, gpus_dir, names, run, lock, invocation))
        except GpuError as e:
            print(f"torchrig GPUs: {e}", file=sys.stderr)
            return 1
        return 0
    queue_dir, config_dir = argv[0], argv[1]
    for job in run_queue(queue_dir, config_dir, {"gpus": argv[2], "nproc_per_node": argv[3]}, run):
        print(f"torchrig queue: started job {job}: its GPUs are free here")
    if stop_timer_when_empty(queue_dir, run):
        print(f"torchrig queue: empty here; {TIMER} stops until train.yml queues a job")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
