"""GPUs per job (issue 32): which GPUs a node's running jobs hold, which a new job gets,
and the queue that starts a job when its GPUs free (torchrig.cluster's module_utils/torchrun_gpus.py).
systemd is stood in for by its `systemctl show` text; the cluster scenario runs the real one."""

import contextlib
import json
import os
import pwd
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import run
from rolepy import load, shared

gpus = shared("torchrun_gpus")
filt = load("roles/torchrun/filter_plugins/torchrun_gpus.py", "torchrun_gpus_filter")
CONTRACT = load("roles/torchrig/filter_plugins/torchrig_contract.py", "torchrig_contract").contract()
ENV, METRICS = CONTRACT["env"], CONTRACT["files"]["metrics"]
NAMES = {"gpus": ENV["gpus"], "nproc_per_node": ENV["nproc_per_node"]}
GPUS = ENV["gpus"]
T0 = 1_800_000_000


def job(name, held, since=T0, running=True):
    return {"job": name, "gpus": held, "since": since, "running": running}


def test_a_job_gets_the_lowest_free_gpus():
    assert gpus.choose(2, [job("a", [0])], 1, "b", "node1") == [1]
    assert gpus.choose(4, [job("a", [1, 2])], 2, "b", "node1") == [0, 3]
    assert gpus.choose(2, [], None, "b", "node1") == [0, 1]  # default: all


def test_a_job_that_does_not_fit_is_refused_naming_each_holder_and_when_it_started():
    with pytest.raises(gpus.GpuError) as e:
        gpus.choose(2, [job("b", [1], T0 + 60), job("a", [0])], 1, "c", "node1")
    msg = str(e.value)
    assert msg.startswith("Job c asks for 1 GPUs per node but node1 has 0 of 2 free (")
    assert "job a holds GPU 0 since 2027-01-15 08:00:00 UTC; job b holds GPU 1 since 2027-01-15 08:01:00 UTC" in msg
    assert "-e queue=true" in msg and msg.endswith("No job was started.")


def test_stopped_jobs_and_the_job_itself_hold_nothing():
    jobs = [job("a", [0], running=False), job("c", [1])]
    assert gpus.free_gpus(2, jobs, "c") == [0, 1]


def test_more_than_the_node_has_is_refused_and_bad_values_named():
    with pytest.raises(gpus.GpuError, match="asks for 3 GPUs per node .gpus=3. but node1 has 2"):
        gpus.choose(2, [], "3", "j", "node1")
    with pytest.raises(gpus.GpuError, match="gpus must be a whole number of GPUs per node from 1, or all; got 'x'"):
        gpus.choose(2, [], "x", "j", "node1")
    assert filt.FilterModule().filters()["torchrun_gpu_choice"]([job("a", [0, 1])], 2, 1, "j", "n")["problem"]


SHOW = """Id=torchrig-job@a.service
ActiveState=active
SubState=running
ActiveEnterTimestampMonotonic=5000000

Id=torchrig-job@b.service
ActiveState=inactive
SubState=dead
ActiveEnterTimestampMonotonic=0
"""


def write(path, text):
    path.write_text(text)
    return path


def queue_entry(queue, at, name, want, gpus_dir):
    """A queue entry as tasks/queue.yml writes it: <submit time>-<job>.json."""
    return write(queue / f"{at}-{name}.json", json.dumps({"want": want, "nproc": 0, "gpus_dir": str(gpus_dir)}))


def timer_calls(on_stop=None):
    """A stand-in for systemctl that records its arguments; on_stop runs at a stop."""
    calls = []

    def run(argv):
        calls.append(argv[1:])
        if argv[1] == "stop" and on_stop:
            on_stop()
        return ""
    return calls, run


def test_the_gpus_held_are_read_from_running_units_only(tmp_path):
    for name in ("a", "b"):
        write(tmp_path / f"{name}.env", "x=1\n")
        write(tmp_path / f"{name}.gpus", f"# c\n{GPUS}=1\n")
    # A name that is not a job's is never handed to systemctl.
    write(tmp_path / "bad name;rm.env", "")
    asked = []

    def run(argv):
        asked.append(argv)
        return SHOW

    jobs = gpus.node_jobs(str(tmp_path), GPUS, run, now=T0, mono_now=105.0)
    assert asked[0][-2:] == ["torchrig-job@a.service", "torchrig-job@b.service"]
    assert jobs == [
        {"job": "a", "state": "active/running", "running": True, "since": T0 - 100, "gpus": [1]},
        {"job": "b", "state": "inactive/dead", "running": False, "since": 0, "gpus": []},
    ]


def test_a_gpu_list_that_is_not_one_holds_nothing(tmp_path):
    write(tmp_path / "a.env", "")
    write(tmp_path / "a.gpus", f"{GPUS}=0;rm -rf /\n")
    assert gpus.node_jobs(str(tmp_path), GPUS, lambda a: SHOW, T0, 105.0)[0]["gpus"] == []
    with pytest.raises(ValueError):
        gpus.parse_gpus("1,x")


def test_the_gpus_file_pins_cuda_and_runs_one_process_per_gpu():
    text = filt.FilterModule().filters()["torchrun_gpus_env"]([1], 0, NAMES)
    assert GPUS + "=1\nCUDA_DEVICE_ORDER=PCI_BUS_ID\nCUDA_VISIBLE_DEVICES=1\n" + ENV["nproc_per_node"] + "=1\n" in text
    # A job that set its own processes per node keeps them.
    assert "NPROC" not in gpus.gpus_env([0, 1], 4, NAMES)


@pytest.mark.skipif(os.geteuid() != 0, reason="the runner gives the .gpus file to root, as on a node")
def test_the_queue_starts_jobs_first_come_first_served(tmp_path):
    config, queue, gpus_dir = tmp_path / "jobs", tmp_path / "queue", tmp_path / "gpus"
    for d in (config, queue, gpus_dir / "0000:3b:00.0", gpus_dir / "0000:5e:00.0"):
        d.mkdir(parents=True)
    running = {"a": "1"}  # job a runs and holds GPU 1
    for name in ("a", "big", "small"):
        write(config / f"{name}.env", "")
    write(config / "a.gpus", f"{GPUS}=1\n")
    # big came first and needs both GPUs: small (one GPU, free now) must not pass it.
    for at, name, want in ((100, "big", 2), (200, "small", 1)):
        queue_entry(queue, at, name, want, gpus_dir)
    write(queue / "junk.json", "{}")
    started = []

    def run(argv):
        if argv[:2] == ["systemctl", "enable"]:
            started.append(argv[-1])
            running[argv[-1].split("@")[1].split(".")[0]] = "1"
            return ""
        return "\n\n".join(f"Id={u}\nActiveState={'active' if u.split('@')[1][:-8] in running else 'inactive'}\n"
                           "SubState=x\nActiveEnterTimestampMonotonic=1" for u in argv[3:])

    assert gpus.run_queue(str(queue), str(config), NAMES, run) == []
    assert [e["job"] for e in gpus.queue_entries(str(queue))] == ["big", "small"]
    del running["a"]  # a ends: big takes both GPUs, small waits on
    assert gpus.run_queue(str(queue), str(config), NAMES, run) == ["big"]
    assert "CUDA_VISIBLE_DEVICES=0,1\n" in (config / "big.gpus").read_text()
    assert started == ["torchrig-job@big.service"]
    assert [e["job"] for e in gpus.queue_entries(str(queue))] == ["small"]


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the run directories to another user, as train.yml does")
def test_the_jobs_module_reads_progress_as_the_jobs_user_only(tmp_path):
    """status.yml's progress comes from the job's metrics, read as the owner of its run
    directory (never root): a cut last line is skipped, a file the job's user cannot read
    and a run directory that is a link give nothing."""
    # The job's user must reach its run directory: pytest's own tmp_path is root's only.
    top = Path(tempfile.mkdtemp(prefix="torchrig-pytest-runs-"))
    top.chmod(0o711)
    config, runs = tmp_path / "jobs", top / "runs"
    for d in (config, runs / "ok", runs / "secret"):
        d.mkdir(parents=True)
    nobody = pwd.getpwnam("nobody")
    for name in ("ok", "secret", "linked"):
        write(config / f"{name}.env", "x=1\n")
    write(runs / "ok" / METRICS, '{"split": "train", "step": 5, "epoch": 0, "loss": 0.25}\n{"split": "tr')
    write(runs / "secret" / METRICS, '{"split": "train", "step": 9, "epoch": 1}\n').chmod(0o600)
    (runs / "linked").symlink_to(runs / "ok")
    for d in (runs / "ok", runs / "ok" / METRICS, runs / "secret"):
        os.chown(d, nobody.pw_uid, nobody.pw_gid)
    os.chown(runs / "linked", nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
    proc = run(["ansible", "localhost", "-c", "local", "-M", "roles/torchrun/library", "-m", "torchrun_jobs",
                "-a", json.dumps({"config_dir": str(config), "gpus_name": GPUS, "run_root": str(runs),
                                  "metrics": METRICS, "queue_dir": str(tmp_path / "queue")}),
                "-o"], env={"ANSIBLE_MODULE_UTILS": "roles/torchrun/module_utils"}, check=True)
    shutil.rmtree(top)
    got = {j["job"]: j["progress"] for j in json.loads(proc.stdout.split("=>", 1)[1])["jobs"]}
    assert got["ok"].pop("at") > 0
    assert got == {"ok": {"step": 5, "epoch": 0, "loss": 0.25}, "secret": {}, "linked": {}}


def test_the_drain_waits_on_the_same_running_states_as_the_gpu_choice():
    """tasks/drain.yml waits until a stopped job's unit is no longer running, in systemd's
    states that the GPU choice counts as holding GPUs."""
    running = filt.FilterModule().filters()["torchrun_unit_running"]
    assert [s for s in ("active", "activating", "deactivating", "reloading", "inactive", "failed", "")
            if running(s)] == ["active", "activating", "deactivating", "reloading"]


def test_the_queue_stops_its_timer_once_empty_and_not_before(tmp_path):
    """A timer with nothing to do would write a journal line every few seconds for good."""
    queue = tmp_path / "queue"
    queue.mkdir()
    calls, run = timer_calls()
    entry = queue_entry(queue, 100, "big", 2, tmp_path)
    assert not gpus.stop_timer_when_empty(str(queue), run) and calls == []
    entry.unlink()
    write(queue / "junk.json", "{}")  # not an entry: the queue is empty
    assert gpus.stop_timer_when_empty(str(queue), run)
    assert calls == [["stop", gpus.TIMER]]


def test_an_entry_written_while_the_timer_stops_starts_it_again(tmp_path):
    queue = tmp_path / "queue"
    queue.mkdir()
    # train.yml queues a job just as the runner stops the timer.
    calls, run = timer_calls(on_stop=lambda: queue_entry(queue, 200, "late", 1, tmp_path))
    assert not gpus.stop_timer_when_empty(str(queue), run)
    assert calls == [["stop", gpus.TIMER], ["start", gpus.TIMER]]


def test_the_runner_says_when_the_queue_is_empty_and_its_timer_stops(tmp_path, capsys):
    config, queue = tmp_path / "jobs", tmp_path / "queue"
    config.mkdir()
    queue.mkdir()
    calls = []
    assert gpus.main([str(queue), str(config), NAMES["gpus"], NAMES["nproc_per_node"]],
                     lambda argv: calls.append(argv) or "") == 0
    assert calls == [["systemctl", "stop", gpus.TIMER]]
    assert f"empty here; {gpus.TIMER} stops" in capsys.readouterr().out


# ------------------------------------------------------------------ the claim as a unit starts


def on(*held, nproc=0):
    """A .gpus file holding these GPUs."""
    return gpus.gpus_env(list(held), nproc, NAMES)


def claim_node(tmp_path, files, states=None):
    """A node's config directory with <job>.env and the .gpus files given, two stand-in GPUs,
    and a stand-in systemctl: each job's (ActiveState, SubState, InvocationID) from `states`,
    by default running since before (active, running)."""
    config, gpus_dir = tmp_path / "jobs", tmp_path / "gpus"
    for d in (config, gpus_dir / "0000:3b:00.0", gpus_dir / "0000:5e:00.0"):
        d.mkdir(parents=True)
    for name, text in files.items():
        write(config / f"{name}.env", "")
        if text is not None:
            write(config / f"{name}.gpus", text)
    states = states or {}

    def show(argv):
        out = []
        for unit in argv[3:]:
            active, sub, invocation = states.get(unit.split("@")[1][:-8], ("active", "running", "i0"))
            out.append(f"Id={unit}\nActiveState={active}\nSubState={sub}\nInvocationID={invocation}\n"
                       "ActiveEnterTimestampMonotonic=0")
        return "\n\n".join(out)
    return config, gpus_dir, show


def test_a_unit_that_starts_keeps_the_gpus_it_was_given(tmp_path):
    config, gpus_dir, show = claim_node(tmp_path, {"a": on(1), "b": on(0)})
    done = gpus.claim("a", str(config), str(gpus_dir), NAMES, show, lock=str(tmp_path / "lock"))
    assert done == "job a holds GPU 1 here"
    assert (config / "a.gpus").read_text() == on(1)


def test_gpus_a_job_started_at_the_same_moment_took_are_swapped_for_free_ones(tmp_path):
    # Both train.yml runs saw GPU 0 free; b's unit started first and holds it.
    config, gpus_dir, show = claim_node(tmp_path, {"a": on(0, nproc=2), "b": on(0)})
    done = gpus.claim("a", str(config), str(gpus_dir), NAMES, show, lock=str(tmp_path / "lock"))
    assert done == "job a holds GPU 1 here: GPU 0 went to another job that started at the same time"
    # The job's own process count (nproc 2: no line of torchrig's) is kept.
    assert (config / "a.gpus").read_text() == on(1, nproc=2)
    assert NAMES["nproc_per_node"] not in (config / "a.gpus").read_text()
    assert not (config / "a.refused").exists()


def test_a_start_that_finds_its_gpus_taken_and_none_free_is_refused_saying_why(tmp_path, capsys):
    config, gpus_dir, show = claim_node(tmp_path, {"a": on(0, 1), "b": on(1)})
    argv = ["claim", "a", str(config), str(gpus_dir), NAMES["gpus"], NAMES["nproc_per_node"]]
    assert gpus.main(argv, show, lock=str(tmp_path / "lock")) == 1
    said = capsys.readouterr().err
    assert said.startswith("torchrig GPUs: Job a asks for 2 GPUs per node but 1 of the 2 here are free as it starts")
    assert "job b holds GPU 1 since a moment ago" in said and "-e queue=true" in said
    assert (config / "a.refused").read_text() == said.removeprefix("torchrig GPUs: ")
    # Nothing of the job's own was changed.
    assert (config / "a.gpus").read_text() == on(0, 1)


def test_two_units_starting_at_once_claim_one_after_the_other(tmp_path):
    """Both were given GPU 0 by train.yml runs started together, and both units are in
    ExecStartPre. Each claim asks systemd at the same moment where it can (a barrier both
    must reach, given up after 1 s): without the node's lock neither would see the other's
    claim, and both would keep GPU 0. With it, the first gives up waiting and goes on alone."""
    starting = {"a": ("activating", "start-pre", "ia"), "b": ("activating", "start-pre", "ib")}
    config, gpus_dir, show = claim_node(tmp_path, {"a": on(0), "b": on(0)}, starting)
    together = threading.Barrier(2)

    def show_together(argv):
        with contextlib.suppress(threading.BrokenBarrierError):
            together.wait(timeout=1)
        return show(argv)

    lock = str(tmp_path / "lock")
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda j: gpus.claim(j, str(config), str(gpus_dir), NAMES, show_together, lock=lock,
                                           invocation=starting[j][2]), ["a", "b"]))
    held = {j: gpus.parse_env((config / f"{j}.gpus").read_text())[GPUS] for j in ("a", "b")}
    assert sorted(held.values()) == ["0", "1"], held


def test_a_job_without_a_gpu_file_claims_nothing(tmp_path):
    config, gpus_dir, show = claim_node(tmp_path, {"cpu": None})
    done = gpus.claim("cpu", str(config), str(gpus_dir), NAMES, show, lock=str(tmp_path / "lock"))
    assert done == "job cpu holds no GPUs here"
    assert not (config / "cpu.gpus").exists()


def test_the_queue_keeps_an_entry_whose_start_was_refused(tmp_path):
    config, queue, gpus_dir = tmp_path / "jobs", tmp_path / "queue", tmp_path / "gpus"
    for d in (config, queue, gpus_dir / "0000:3b:00.0"):
        d.mkdir(parents=True)
    write(config / "q.env", "")
    queue_entry(queue, 100, "q", 1, gpus_dir)
    calls = []

    def run(argv):
        calls.append(argv[1:3])
        if argv[1] == "enable":  # the unit's claim found its GPU taken meanwhile
            write(config / "q.refused", "taken\n")
        return "Id=torchrig-job@q.service\nActiveState=inactive\nSubState=dead\n" if argv[1] == "show" else ""

    assert gpus.run_queue(str(queue), str(config), NAMES, run) == []
    assert ["disable", "--now"] in calls
    assert [e["job"] for e in gpus.queue_entries(str(queue))] == ["q"]


def test_a_unit_holds_its_gpus_once_its_claim_took_them(tmp_path):
    """In ExecStartPre (perhaps waiting for the node's lock) or waiting to restart after a
    refusal, a unit holds nothing; once its claim has written its invocation, it does."""
    states = {"a": ("activating", "start-pre", "ia"), "b": ("activating", "auto-restart", "ib"),
              "c": ("active", "running", "ic")}
    config, gpus_dir, show = claim_node(tmp_path, {"a": on(0), "b": on(1), "c": on(1)}, states)
    write(config / "b.claimed", "an-earlier-invocation\n")
    held = {j["job"]: j["gpus"] for j in gpus.node_jobs(str(config), GPUS, show)}
    assert held == {"a": [], "b": [], "c": [1]}
    write(config / "a.claimed", "ia\n")
    assert {j["job"]: j["gpus"] for j in gpus.node_jobs(str(config), GPUS, show)}["a"] == [0]


def test_of_two_units_asking_for_every_gpu_at_once_the_first_claim_wins(tmp_path):
    """Both in ExecStartPre, both given both GPUs: the first claim takes them; the second is
    refused, and while it waits to restart it holds none. (Before units held GPUs only from
    their claim on, each saw the other's and both were refused.)"""
    states = {"x": ("activating", "start-pre", "ix"), "y": ("activating", "start-pre", "iy")}
    config, gpus_dir, show = claim_node(tmp_path, {"x": on(0, 1), "y": on(0, 1)}, states)
    lock = str(tmp_path / "lock")
    done = gpus.claim("x", str(config), str(gpus_dir), NAMES, show, lock=lock, invocation="ix")
    assert done == "job x holds GPU 0,1 here"
    with pytest.raises(gpus.GpuError, match=r"Job y asks for 2 GPUs .* \(job x holds GPU 0,1 since"):
        gpus.claim("y", str(config), str(gpus_dir), NAMES, show, lock=lock, invocation="iy")
    states["y"] = ("activating", "auto-restart", "iy")
    held = {j["job"]: j["gpus"] for j in gpus.node_jobs(str(config), GPUS, show)}
    assert held == {"x": [0, 1], "y": []}
