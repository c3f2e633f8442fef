"""Wait for a job to end on a node, printing its progress, in one task.

train.yml used to poll with a task file that included itself once per poll;
Ansible's include depth ran out after about 250 polls (RecursionError), so a
job longer than about 20 minutes crashed the wait. This action loops in
Python instead: it runs the torchrun_job_state module on the node, which
polls systemd locally for up to progress_every seconds, prints one progress
line, and goes on until the job has ended or timeout seconds have passed (0: no
limit).
"""

from __future__ import annotations

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


def progress_line(job: str, host: str, state: dict, metrics: dict) -> str:
    """One line of progress: the unit's state and rank 0's newest metrics on this node."""
    parts = [f"{job} on {host}: {state.get('ActiveState', '?')}/{state.get('SubState', '?')}"]
    if metrics.get("step") is not None:
        parts.append(f"epoch {metrics.get('epoch')} step {metrics['step']}")
    for key, fmt in (("loss", "loss {:.4f}"), ("accuracy", "accuracy {:.4f}"), ("samples_per_s", "{:.0f} samples/s")):
        if isinstance(metrics.get(key), (int, float)):
            parts.append(fmt.format(metrics[key]))
    return " | ".join(parts)


class ActionModule(ActionBase):
    """torchrun_wait: job, unit, metrics, run_dir, end_files, poll_interval, progress_every, timeout."""

    _VALID_ARGS = frozenset(("job", "unit", "metrics", "run_dir", "end_files", "poll_interval", "progress_every",
                             "timeout"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        job, unit, metrics_path = args["job"], args["unit"], args["metrics"]
        poll = float(args.get("poll_interval", 5))
        every = max(poll, float(args.get("progress_every", 30)))
        # 0 (or less): no limit. A job of days is normal, and Ctrl-C leaves it running.
        timeout = float(args.get("timeout", 0)) or float("inf")
        if timeout < 0:
            timeout = float("inf")
        host = task_vars.get("inventory_hostname", "?")
        start = time.monotonic()
        polls, lines = 0, 0
        while True:
            remaining = timeout - (time.monotonic() - start)
            out = self._execute_module(
                module_name="torchrun_job_state",
                module_args={"unit": unit, "metrics": metrics_path, "run_dir": args.get("run_dir"),
                             "end_files": args.get("end_files", []),
                             "poll_interval": poll,
                             "max_seconds": max(0.0, min(every, remaining))},
                task_vars=task_vars)
            if out.get("failed"):
                return dict(result, **out)
            polls += out["polls"]
            lines += 1
            display.display(progress_line(job, host, out["state"], out["metrics"]))
            display.v(f"{job} on {host}: {polls} polls in {time.monotonic() - start:.1f} s")
            if not out["running"] or time.monotonic() - start >= timeout:
                break
        result.update(changed=False, state=out["state"], metrics=out["metrics"], running=out["running"],
                      ended=out.get("ended", {}),
                      polls=polls, progress_lines=lines, waited_s=round(time.monotonic() - start, 1))
        return result
