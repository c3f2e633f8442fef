"""Every job on the cluster at a glance (playbooks/status.yml without job=): one row per job
from what each node's torchrun_jobs module said. Plain functions, unit-tested in
tests/test_torchrun_status.py.

A node's answer is untrusted input: every field is checked here, where it enters the
controller, and what is not of the expected shape is left out (a job name that is not one,
GPU numbers that are not small whole numbers, times that are not whole seconds).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
STATE = re.compile(r"[a-z-]{1,20}/[a-z-]{1,30}")
RUNNING = ("active", "activating", "deactivating", "reloading")
COLUMNS = ("job", "state", "nodes", "gpus", "step", "epoch", "age", "idle", "queue")


def _int(value: Any, low: int = 0, high: int = 2**63) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high else None


def _node_jobs(report: Any) -> list[dict[str, Any]]:
    """A node's jobs, each checked; malformed ones left out."""
    out = []
    for job in report.get("jobs", []) if isinstance(report, Mapping) else []:
        if not isinstance(job, Mapping) or not JOB_NAME.fullmatch(str(job.get("job", ""))):
            continue
        gpus = job.get("gpus") if isinstance(job.get("gpus"), list) else []
        progress = job.get("progress") if isinstance(job.get("progress"), Mapping) else {}
        loss = progress.get("loss")
        out.append({
            "job": str(job["job"]),
            "state": str(job.get("state")) if STATE.fullmatch(str(job.get("state", ""))) else "unknown/unknown",
            "since": _int(job.get("since")) or 0,
            "gpus": [g for g in gpus if _int(g, 0, 999) is not None],
            "step": _int(progress.get("step")), "epoch": _int(progress.get("epoch")),
            "loss": float(loss) if isinstance(loss, (int, float)) and not isinstance(loss, bool)
            and math.isfinite(loss) else None,
            "at": _int(progress.get("at")) or 0,
        })
    return out


def _queue(reports: Mapping[str, Any]) -> list[str]:
    """The GPU queue across the cluster, first come first: a job queued on several nodes
    counts once, at its earliest entry."""
    first: dict[str, int] = {}
    for report in reports.values():
        for entry in report.get("queue", []) if isinstance(report, Mapping) else []:
            if isinstance(entry, Mapping) and JOB_NAME.fullmatch(str(entry.get("job", ""))) \
                    and _int(entry.get("at")) is not None:
                first[str(entry["job"])] = min(first.get(str(entry["job"]), entry["at"]), entry["at"])
    return sorted(first, key=lambda j: (first[j], j))


def job_rows(reports: Mapping[str, Any], now: float) -> list[dict[str, Any]]:
    """One row per job: {job, state, nodes, gpus {node: [..]}, step, epoch, loss, started,
    age_s, idle_s, queue}. state: running (on every node that has it), partly running,
    queued, failed, ended or unknown (what the nodes said was not a unit state); age_s: since
    it started (queued: since it joined the queue)."""
    queue = _queue(reports)
    queued_at = {}
    for report in reports.values():
        for entry in report.get("queue", []) if isinstance(report, Mapping) else []:
            if isinstance(entry, Mapping) and str(entry.get("job")) in queue and _int(entry.get("at")) is not None:
                queued_at[str(entry["job"])] = min(queued_at.get(str(entry["job"]), entry["at"]), entry["at"])
    by_job: dict[str, dict[str, dict[str, Any]]] = {}
    for node, report in sorted(reports.items()):
        for job in _node_jobs(report):
            by_job.setdefault(job["job"], {})[str(node)] = job
    rows = []
    for name in sorted(by_job, key=lambda j: (j not in queue, queue.index(j) if j in queue else 0, j)):
        parts = by_job[name]
        running = [n for n, j in parts.items() if j["state"].split("/")[0] in RUNNING]
        failed = [n for n, j in parts.items() if j["state"].startswith("failed/")]
        if running:
            state = "running" if len(running) == len(parts) else f"partly running ({len(running)} of {len(parts)})"
        elif name in queue:
            state = "queued"
        elif all(j["state"] == "unknown/unknown" for j in parts.values()):
            state = "unknown"
        else:
            state = "failed" if failed else "ended"
        started = min((j["since"] for j in parts.values() if j["since"]), default=0)
        if name in queue and not running:
            started = int(queued_at[name] // 10**9)
        at = max((j["at"] for j in parts.values()), default=0)
        steps = [j["step"] for j in parts.values() if j["step"] is not None]
        epochs = [j["epoch"] for j in parts.values() if j["epoch"] is not None]
        losses = [j["loss"] for j in parts.values() if j["loss"] is not None]
        rows.append({
            "job": name, "state": state, "nodes": sorted(parts),
            "gpus": {n: j["gpus"] for n, j in sorted(parts.items()) if j["gpus"]},
            "step": max(steps, default=None), "epoch": max(epochs, default=None),
            "loss": losses[0] if losses else None,
            "started": started, "age_s": int(now - started) if started else None,
            "idle_s": int(now - at) if at and running else None,
            "queue": queue.index(name) + 1 if name in queue and not running else None,
        })
    return rows


def _span(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds < 172800 else f"{seconds // 86400}d"


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a text table, one line per job."""
    if not rows:
        return "No job on the cluster."
    lines = [list(COLUMNS)]
    for r in rows:
        lines.append([
            r["job"], r["state"], ",".join(r["nodes"]),
            " ".join(f"{n}:{','.join(map(str, g))}" for n, g in r["gpus"].items()) or "-",
            "-" if r["step"] is None else str(r["step"]), "-" if r["epoch"] is None else str(r["epoch"]),
            _span(r["age_s"]), _span(r["idle_s"]), "-" if r["queue"] is None else str(r["queue"]),
        ])
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def status(reports: Mapping[str, Any], now: float, fmt: str = "table") -> Any:
    """status.yml's output: the table's lines, or for format=json the rows as one document
    ({"jobs": [...]})."""
    rows = job_rows(reports, now)
    if fmt == "json":
        return {"jobs": json.loads(json.dumps(rows))}
    return table(rows).splitlines()


class FilterModule:
    def filters(self):
        return {"torchrun_status": status}
