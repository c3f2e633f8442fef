"""health.yml's iperf3 runs unprivileged (issue 31, item 11): iperf3 parses what a
peer sends, so both its server and its client run as health_iperf_user (nobody),
never as root."""

from __future__ import annotations

import yaml
from rolepy import ROOT

ROLE = ROOT / "roles/health"


def test_every_iperf3_command_runs_as_the_unprivileged_user():
    tasks = yaml.safe_load((ROLE / "tasks/iperf.yml").read_text())
    runs = [t for t in tasks if "iperf3 --" in str(t.get("ansible.builtin.command", ""))]
    assert [t["name"] for t in runs] == [
        "Start a one-shot iperf3 server on every node",
        "Measure TCP throughput to the next node (one pair at a time)",
    ]
    for task in runs:
        assert task.get("become") is True and task.get("become_user") == "{{ health_iperf_user }}", task["name"]


def test_the_user_is_unprivileged_by_default_and_root_is_refused():
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    spec = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert defaults["health_iperf_user"] == spec["health_iperf_user"]["default"] == "nobody"
    tasks = yaml.safe_load((ROLE / "tasks/iperf.yml").read_text())
    check = next(t for t in tasks if t["name"] == "Check that iperf3 runs unprivileged")
    assert "'root'" in check["ansible.builtin.assert"]["that"]
