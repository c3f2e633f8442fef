#!/usr/bin/python
"""Poll a job's unit on this node until it ends or a time is up.

The polling happens here, on the node, in one module run: the torchrun_wait
action calls this once per progress line, not once per poll, so a wait costs
one SSH round trip per line however short the poll interval is.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchrig.cluster.plugins.module_utils.torchrun_gpus import job_running

DOCUMENTATION = r"""
module: torchrun_job_state
short_description: Poll a torchrig job's unit until it ends or max_seconds pass
description:
  - Reads the unit's state from systemd every poll_interval seconds, returns as
    soon as it is no longer active (or activating, deactivating, reloading), or
    the job has ended for good on this node (one of end_files; systemd may
    still be stopping the unit), or max_seconds have passed, with the last line of
    the job's metrics. Changes nothing.
options:
  unit: {description: The job's systemd unit., type: str, required: true}
  metrics: {description: The job's metrics file on this node., type: path, required: true}
  poll_interval: {description: Seconds between polls., type: float, default: 5}
  max_seconds: {description: Return after this many seconds even if the job still runs., type: float, default: 30}
  run_dir: {description: The job's run directory (one of its end_files says why it ended)., type: path}
  end_files:
    description: >-
      The files a job leaves in run_dir when it ends for good (the job contract's files.fatal and
      files.ended).
    type: list
    elements: str
    default: []
"""

RETURN = r"""
state:
  description: ActiveState, SubState, Result, NRestarts and the time the unit entered its state.
  type: dict
  returned: always
running:
  description: Whether the unit is still active (or activating, deactivating, reloading).
  type: bool
  returned: always
metrics: {description: "The newest metrics record on this node, empty before the first.", type: dict, returned: always}
polls: {description: How many times systemd was asked, type: int, returned: always}
ended:
  description: >-
    The first of end_files found in the run directory (a worker's usage, import or missing-file
    error; nodes that did not join), with the file's name; {} when none.
  type: dict
  returned: always
"""

PROPERTIES = ("ActiveState", "SubState", "Result", "NRestarts", "StateChangeTimestamp")


def unit_state(unit: str) -> dict[str, str]:
    """The unit's properties as systemctl show prints them."""
    out = subprocess.run(
        ["systemctl", "show", "--property=" + ",".join(PROPERTIES), unit],
        check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def last_metrics(path: str) -> dict:
    """The last complete JSON line of the metrics file, or {}."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            return record
    return {}


def ended_for_good(run_dir: str | None, end_files: list[str]) -> dict:
    """The first of `end_files` (written by torchrig.worker and torchrig.launch when a job
    ends for good) in run_dir, parsed, with its name under "file"; {} if none."""
    for name in end_files if run_dir else ():
        try:
            with open(os.path.join(run_dir, name)) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            return dict(record, file=name)
    return {}


def main() -> None:
    module = AnsibleModule(
        argument_spec={"unit": {"type": "str", "required": True},
                       "metrics": {"type": "path", "required": True},
                       "poll_interval": {"type": "float", "default": 5},
                       "max_seconds": {"type": "float", "default": 30},
                       "run_dir": {"type": "path"},
                       "end_files": {"type": "list", "elements": "str", "default": []}},
        supports_check_mode=True,
    )
    p = module.params
    deadline = time.monotonic() + p["max_seconds"]
    polls = 0
    while True:
        try:
            state = unit_state(p["unit"])
        except (OSError, subprocess.CalledProcessError) as e:
            module.fail_json(msg=f"systemctl show {p['unit']} failed: {e}")
        polls += 1
        ended = ended_for_good(p["run_dir"], p["end_files"])
        running = job_running(state.get("ActiveState"), ended)
        if not running or time.monotonic() + p["poll_interval"] > deadline:
            break
        time.sleep(p["poll_interval"])
    module.exit_json(changed=False, state=state, running=running, polls=polls,
                     metrics=last_metrics(p["metrics"]), ended=ended)


if __name__ == "__main__":
    main()
