"""Every job at a glance (issue 32): status.yml without job= turns each node's answer
(roles/torchrun/library/torchrun_jobs.py) into one row per job
(roles/torchrun/filter_plugins/torchrun_status.py). A node's answer is untrusted input."""

from rolepy import load

st = load("roles/torchrun/filter_plugins/torchrun_status.py", "torchrun_status")
NOW = 1_800_000_000


def job(name, state="active/running", since=NOW - 600, gpus=(), progress=None):
    return {"job": name, "state": state, "since": since, "gpus": list(gpus), "progress": progress or {}}


REPORTS = {
    "node1": {"jobs": [job("a", gpus=[0], progress={"step": 40, "epoch": 1, "loss": 0.5, "at": NOW - 3}),
                       job("b", since=NOW - 60, gpus=[1], progress={"step": 7, "epoch": 0, "at": NOW - 1}),
                       job("c", "inactive/dead", since=0), job("old", "failed/failed", since=NOW - 9000)],
              "queue": [{"at": (NOW - 30) * 10**9, "job": "c", "want": 1}]},
    "node2": {"jobs": [job("a", gpus=[0], progress={"step": 41, "epoch": 1, "at": NOW - 2}),
                       job("b", since=NOW - 61, gpus=[1]), job("c", "inactive/dead", since=0)],
              "queue": [{"at": (NOW - 30) * 10**9, "job": "c", "want": 1}]},
}


def test_one_row_per_job_with_its_state_gpus_progress_age_and_queue_position():
    rows = {r["job"]: r for r in st.job_rows(REPORTS, NOW)}
    assert rows["a"] == {"job": "a", "state": "running", "nodes": ["node1", "node2"],
                         "gpus": {"node1": [0], "node2": [0]}, "step": 41, "epoch": 1, "loss": 0.5,
                         "started": NOW - 600, "age_s": 600, "idle_s": 2, "queue": None}
    assert rows["b"]["gpus"] == {"node1": [1], "node2": [1]} and rows["b"]["age_s"] == 61
    assert (rows["c"]["state"], rows["c"]["queue"], rows["c"]["age_s"], rows["c"]["gpus"]) == ("queued", 1, 30, {})
    assert (rows["old"]["state"], rows["old"]["nodes"], rows["old"]["idle_s"]) == ("failed", ["node1"], None)
    # The queue first, then by name.
    assert [r["job"] for r in st.job_rows(REPORTS, NOW)] == ["c", "a", "b", "old"]


def test_the_table_has_a_line_per_job_and_json_the_same_rows():
    lines = st.status(REPORTS, NOW)
    assert lines[0].split() == ["job", "state", "nodes", "gpus", "step", "epoch", "age", "idle", "queue"]
    assert lines[2].split() == ["a", "running", "node1,node2", "node1:0", "node2:0", "41", "1", "10m", "2s", "-"]
    assert lines[1].split() == ["c", "queued", "node1,node2", "-", "-", "-", "30s", "-", "1"]
    assert st.status(REPORTS, NOW, "json")["jobs"] == st.job_rows(REPORTS, NOW)
    assert st.status({}, NOW) == ["No job on the cluster."]


def test_what_a_node_says_is_checked_where_it_enters():
    bad = {"node1": {"jobs": [job("../etc", gpus=[0]), job("x\nrm", gpus=[0]), "not a job",
                              job("ok", state="active/running; rm", gpus=["0", 1, -1, True],
                                  progress={"step": "7", "epoch": True, "loss": float("nan"), "at": "x"})],
                     "queue": [{"at": "soon", "job": "q"}, {"at": 5, "job": "a b"}]},
           "node2": "garbage"}
    rows = st.job_rows(bad, NOW)
    assert [r["job"] for r in rows] == ["ok"]
    assert rows[0] == {"job": "ok", "state": "unknown", "nodes": ["node1"], "gpus": {"node1": [1]}, "step": None,
                       "epoch": None, "loss": None, "started": NOW - 600, "age_s": 600, "idle_s": None,
                       "queue": None}
