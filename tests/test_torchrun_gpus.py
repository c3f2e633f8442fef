"""GPUs per job (issue 32): which GPUs a node's running jobs hold, which a new job gets,
and the queue that starts a job when its GPUs free (roles/torchrun/module_utils/torchrun_gpus.py).
systemd is stood in for by its `systemctl show` text; the cluster scenario runs the real one."""

import json
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import run
from rolepy import load

gpus = load("roles/torchrun/module_utils/torchrun_gpus.py", "torchrun_gpus")
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
