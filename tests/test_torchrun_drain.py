"""A node's drain before a change that ends its jobs (issue 32): roles/torchrun/tasks/drain.yml
and its filter, roles/torchrun/filter_plugins/torchrun_drain.py. What the node says is
untrusted input; the scenario case (a driver change refused, then drained) is in
molecule/nvidia_driver."""

import base64

from rolepy import load
from torchrig.contract import ENV

dr = load("roles/torchrun/filter_plugins/torchrun_drain.py", "torchrun_drain")
NODES = ENV["nodes"]
SINCE = 1_800_000_000  # 2027-01-15 08:00:00 UTC


def read(job, text):
    return {"item": {"job": job}, "content": base64.b64encode(text.encode()).decode()}


def test_only_the_jobs_systemd_says_run_count_and_a_name_that_is_not_one_is_left_out():
    jobs = [{"job": "b", "running": True, "since": SINCE}, {"job": "a", "running": True, "since": 0},
            {"job": "done", "running": False, "since": SINCE}, {"job": "../x", "running": True, "since": SINCE},
            {"job": "c", "running": "yes", "since": SINCE}, {"job": "d", "running": True, "since": True}, "junk"]
    assert dr.running_jobs(jobs) == [{"job": "a", "since": 0}, {"job": "b", "since": SINCE},
                                     {"job": "d", "since": 0}]
    assert dr.running_jobs(None) == []


def test_the_refusal_names_each_job_and_when_it_started_and_the_three_ways_on():
    msg = dr.refusal([{"job": "llm", "since": SINCE}, {"job": "old", "since": 0}], "gpu1",
                     "the NVIDIA driver change to branch 580 (nvidia-open)")
    assert msg.startswith("gpu1: the NVIDIA driver change to branch 580 (nvidia-open) would end "
                          "job llm (running since 2027-01-15 08:00:00 UTC), job old.")
    assert "Nothing was changed on this node." in msg
    assert "playbooks/stop.yml -e job=NAME" in msg and "-e drain=true" in msg
    assert "train.yml -e job=NAME" in msg


def test_each_job_is_stopped_on_this_node_first_then_on_its_other_nodes_the_inventory_knows():
    reads = [read("llm", f"{ENV['job']}=llm\n{NODES}=gpu2=10.0.0.2 gpu1=10.0.0.1 ghost=10.0.0.9\n"),
             read("solo", f"{NODES}=gpu1=10.0.0.1\n")]
    pairs = dr.stop_pairs(reads, "gpu1", ["gpu1", "gpu2", "gpu3"], NODES)
    assert pairs == [["gpu1", "llm"], ["gpu2", "llm"], ["gpu1", "solo"]]


def test_a_settings_file_that_is_not_one_stops_the_job_here_only():
    reads = [read("llm", f"{NODES}_X=gpu2=1\n"), {"item": {"job": "x"}, "content": "%%%not base64"},
             read("$(reboot)", f"{NODES}=gpu2=1\n"), "junk"]
    assert dr.stop_pairs(reads, "gpu1", ["gpu1", "gpu2"], NODES) == [["gpu1", "llm"], ["gpu1", "x"]]


def test_the_drain_says_which_job_it_stopped_where_and_that_the_queue_is_paused():
    msg = dr.drained([["gpu1", "llm"], ["gpu2", "llm"], ["gpu1", "solo"]], "gpu1", "the change", True)
    assert msg == ("gpu1: before the change, stopped job llm on gpu1, gpu2; job solo on gpu1 with a checkpoint, "
                   "and paused the GPU queue here until the change is done. Resume each with "
                   "train.yml -e job=NAME and its other settings.")
