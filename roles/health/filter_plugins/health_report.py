"""health.yml's findings: each node's, then the report across the nodes, its problems
(what failed a threshold) and the table it prints. Plain functions, unit-tested in
tests/test_health_report.py, exposed to the health role as filters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The all-reduce size at which busbw is compared with the iperf3 ceiling.
RATIO_BYTES = 64 * 1024 * 1024
ROW = "%-12s %-14s %-6s %5s %22s %22s  %s"
BENCH_ROW = "%12s %12s %12s %12s"


def node_findings(stack: Mapping[str, Any], clock: Mapping[str, Any], host: str, want_stack: Mapping[str, Any],
                  preflight_gpus: Any, profile: str, gpu: Mapping[str, Any], max_clock_offset_s: Any) -> dict:
    """One node: its torch against the matrix row preflight chose, its GPUs against what
    preflight found (GPU profile only), its clock against the first node's.

    `stack`: the pytorch role's torch report (torch, cuda, torchvision, devices);
    `clock`: torchrig.clock_offset's (offset_s, error_s); `gpu`: preflight's health findings (`problems`, `skipped`).
    """
    gpu_problems = list(gpu.get("problems") or [])
    if profile == "gpu" and stack["devices"] != int(preflight_gpus):
        gpu_problems.append(
            f"{host}: torch sees {stack['devices']} GPU(s), preflight found {preflight_gpus}. Needs: every GPU "
            "visible to CUDA (a pending reboot, CUDA_VISIBLE_DEVICES, the driver).")
    limit = float(max_clock_offset_s)
    return {
        "stack": dict(stack),
        "want_torch": want_stack["torch"],
        # A local version (2.14.1+cu130) is the same release as the matrix's 2.14.1.
        "torch_matches": str(stack["torch"]).split("+")[0] == want_stack["torch"],
        "want_cuda": want_stack.get("cuda"),
        # GPUs torch must see: all that preflight found, on a GPU-profile host.
        "want_gpus": int(preflight_gpus) if profile == "gpu" else 0,
        "gpu": dict(gpu),
        "gpu_problems": gpu_problems,
        # The first node's clock minus this one's, and how far off that figure can be.
        "clock_offset_s": round(clock["offset_s"], 4),
        "clock_error_s": round(clock["error_s"], 4),
        # Over the limit even at the edge of the error bound.
        "clock_over_limit": limit > 0 and abs(clock["offset_s"]) - clock["error_s"] > limit,
    }


def iperf_gbps(result: Mapping[str, Any] | None) -> float | None:
    """Gbit/s received in an `iperf3 --json` run; None when it did not run."""
    if not result:
        return None
    return round(result["end"]["sum_received"]["bits_per_second"] / 1e9, 3)


def report(nodes: Mapping[str, Mapping[str, Any]], links: Mapping[str, float | None], allreduce: Mapping[str, Any],
           first: str, max_clock_offset_s: Any, min_iperf_gbps: Any, min_busbw_ratio: Any) -> dict:
    """The report across the nodes: runs/health/report.json's content. `problems` lists
    what failed a threshold (empty: healthy); thresholds of 0 only report."""
    measured = [gbps for gbps in links.values() if gbps]
    ceiling = min(measured) if measured else None
    row = next((r for r in allreduce["results"] if r["bytes"] == RATIO_BYTES), {})
    ratio = round(float(row["busbw_GBps"]) * 8 / float(ceiling), 3) if ceiling and row else None
    problems = [f"{host}: torch differs from the matrix row" for host, node in nodes.items()
                if not node["torch_matches"]]
    problems += [f"{host}: clock offset from {first} over {max_clock_offset_s} s" for host, node in nodes.items()
                 if node["clock_over_limit"]]
    problems += [problem for node in nodes.values() for problem in node["gpu_problems"]]
    problems += [f"{host}: TCP throughput under {min_iperf_gbps} Gbit/s" for host, gbps in links.items()
                 if gbps is not None and gbps < float(min_iperf_gbps)]
    if ratio is not None and ratio < float(min_busbw_ratio):
        problems.append(f"all-reduce busbw at 64 MB is {ratio} of the iperf3 ceiling, under {min_busbw_ratio}")
    return {"nodes": dict(nodes), "iperf3_gbps": dict(links), "allreduce": dict(allreduce),
            "busbw_over_iperf3_at_64MB": ratio, "problems": problems}


def table(health: Mapping[str, Any], path: str) -> list[str]:
    """The report as the lines health.yml prints."""
    lines = [ROW % ("node", "torch", "cuda", "gpus", "clock offset s (+/-)", "TCP to next Gbit/s", "GPU checks")]
    for host, node in health["nodes"].items():
        problems = node["gpu_problems"]
        checks = ("skipped (CPU profile)" if node["gpu"].get("skipped", False)
                  else "ok" if not problems else f"{len(problems)} problem(s)")
        lines.append(ROW % (host, node["stack"]["torch"], node["stack"]["cuda"], node["stack"]["devices"],
                            f"{float(node['clock_offset_s']):.4f} ({float(node['clock_error_s']):.4f})",
                            health["iperf3_gbps"][host], checks))
    bench = health["allreduce"]
    lines.append(f"all-reduce, {bench['backend']} on {bench['device']}, world size {bench['world_size']}:")
    lines.append(BENCH_ROW % ("bytes", "time us", "algbw GB/s", "busbw GB/s"))
    lines += [f"{int(r['bytes']):12d} {r['time_us']:12.1f} {r['algbw_GBps']:12.3f} {r['busbw_GBps']:12.3f}"
              for r in bench["results"]]
    lines.append(f"busbw / iperf3 ceiling at 64 MB: {health['busbw_over_iperf3_at_64MB']}")
    lines.append(f"report: {path}")
    return lines


class FilterModule:
    def filters(self):
        return {
            "health_node_findings": node_findings,
            "health_iperf_gbps": iperf_gbps,
            "health_report": report,
            "health_table": table,
        }
