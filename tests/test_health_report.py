"""health.yml's findings, report and table (roles/health/filter_plugins/health_report.py)
(the node's stack comes from the pytorch role's report, tested in test_torch_report.py)."""

from __future__ import annotations

import pytest
from rolepy import load

health = load("roles/health/filter_plugins/health_report.py", "health_report")

MATRIX = {"torch": "2.14.1", "cuda": "13.0"}
CPU_GPU = {"skipped": True, "problems": [], "nvidia_smi": None, "xids": [], "dcgm": None}
CLOCK = {"offset_s": 0.000123456, "error_s": 0.00051}


def node(host="node1", stack=None, clock=CLOCK, profile="cpu", gpus=0, gpu=CPU_GPU, limit=1.0):
    stack = stack or {"torch": "2.14.1+cu130", "cuda": "13.0", "devices": 0}
    return health.node_findings(stack, clock, host, MATRIX, gpus, profile, gpu, limit)


def bench(busbw_at_64mb=0.5):
    return {"backend": "gloo", "device": "cpu", "world_size": 2, "results": [
        {"bytes": 1024, "time_us": 120.04, "algbw_GBps": 0.0085, "busbw_GBps": 0.0085},
        {"bytes": 64 * 1024 * 1024, "time_us": 9e4, "algbw_GBps": 0.7, "busbw_GBps": busbw_at_64mb},
    ]}


def test_a_cpu_node_that_matches_the_matrix():
    found = node()
    assert found == {
        "stack": {"torch": "2.14.1+cu130", "cuda": "13.0", "devices": 0}, "want_torch": "2.14.1",
        "torch_matches": True, "want_cuda": "13.0", "want_gpus": 0, "gpu": CPU_GPU, "gpu_problems": [],
        "clock_offset_s": 0.0001, "clock_error_s": 0.0005, "clock_over_limit": False,
    }


def test_torch_that_sees_fewer_gpus_than_preflight_found():
    found = node(stack={"torch": "2.14.1+cu130", "cuda": "13.0", "devices": 7}, profile="gpu", gpus="8",
                 gpu={"problems": ["node1: GPU 3 has uncorrectable ECC errors"]})
    assert found["want_gpus"] == 8
    assert found["gpu_problems"] == [
        "node1: GPU 3 has uncorrectable ECC errors",
        "node1: torch sees 7 GPU(s), preflight found 8. Needs: every GPU visible to CUDA (a pending reboot, "
        "CUDA_VISIBLE_DEVICES, the driver)."]


@pytest.mark.parametrize(("offset", "error", "limit", "over"), [
    (1.4, 0.5, 1.0, False),   # within the limit at the edge of the error bound
    (-1.6, 0.5, 1.0, True),
    (5.0, 0.0, 0, False),     # 0: a report only
    (5.0, 0.0, "2", True),
])
def test_a_clock_is_over_the_limit_only_beyond_its_error_bound(offset, error, limit, over):
    assert node(clock={"offset_s": offset, "error_s": error}, limit=limit)["clock_over_limit"] is over


def test_iperf_throughput_in_gbits():
    assert health.iperf_gbps({"end": {"sum_received": {"bits_per_second": 9.41234e9}}}) == 9.412
    assert health.iperf_gbps(None) is None


def test_a_healthy_report():
    nodes = {"node1": node("node1"), "node2": node("node2")}
    report = health.report(nodes, {"node1": 8.0, "node2": 10.0}, bench(0.5), "node1", 1.0, 0, 0)
    assert report["busbw_over_iperf3_at_64MB"] == 0.5   # 0.5 GB/s * 8 over the slowest link, 8 Gbit/s
    assert report["problems"] == []
    assert list(report) == ["nodes", "iperf3_gbps", "allreduce", "busbw_over_iperf3_at_64MB", "problems"]


def test_every_threshold_that_is_not_met_is_named():
    nodes = {"node1": node("node1", stack={"torch": "2.13.0", "cuda": None, "devices": 0}),
             "node2": node("node2", clock={"offset_s": 3.0, "error_s": 0.1})}
    report = health.report(nodes, {"node1": 8.0, "node2": 0.5}, bench(0.01), "node1", 1.0, "1", 0.5)
    assert report["problems"] == [
        "node1: torch differs from the matrix row",
        "node2: clock offset from node1 over 1.0 s",
        "node2: TCP throughput under 1 Gbit/s",
        "all-reduce busbw at 64 MB is 0.16 of the iperf3 ceiling, under 0.5",
    ]


def test_one_node_has_no_link_and_no_ratio():
    report = health.report({"node1": node()}, {"node1": None}, bench(), "node1", 1.0, 5, 0.5)
    assert report["busbw_over_iperf3_at_64MB"] is None
    assert report["problems"] == []


def test_the_table():
    nodes = {"node1": node("node1"), "node2": node("node2", profile="gpu", gpus=1,
                                                   stack={"torch": "2.14.1+cu130", "cuda": "13.0", "devices": 1},
                                                   gpu={"problems": ["x", "y"]})}
    report = health.report(nodes, {"node1": 8.0, "node2": None}, bench(), "node1", 1.0, 0, 0)
    assert health.table(report, "/runs/health/report.json") == [
        "node         torch          cuda    gpus   clock offset s (+/-)     TCP to next Gbit/s  GPU checks",
        "node1        2.14.1+cu130   13.0       0        0.0001 (0.0005)                    8.0  skipped (CPU profile)",
        "node2        2.14.1+cu130   13.0       1        0.0001 (0.0005)                   None  2 problem(s)",
        "all-reduce, gloo on cpu, world size 2:",
        "       bytes      time us   algbw GB/s   busbw GB/s",
        "        1024        120.0        0.009        0.009",
        "    67108864      90000.0        0.700        0.500",
        "busbw / iperf3 ceiling at 64 MB: 0.5",
        "report: /runs/health/report.json",
    ]

