#!/usr/bin/python
"""What the fetch needs to know of a job's run on this node, read as root in one call.

The fetch (tasks/fetch.yml) needs three things before it lists the job's files as the
job's user: the unit's journal, the run's id and who owns the run directory (the job's
user, or the training user for a job run before jobs had users of their own). As a
command, a slurp and a stat that was three module runs, some 0.2 s each.
"""

from __future__ import annotations

import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.torchrun_record import journal, run_dir, run_id

DOCUMENTATION = r"""
module: torchrun_run_record
short_description: Read a torchrig job's journal, run id and run directory owner on this node
description:
  - Returns the unit's journal (journalctl, short-iso-precise), the first line of
    run_id_file when given, and whether run_dir is a directory (not a link) and its
    owner. The run directory is looked at with lstat, never followed. Changes nothing.
options:
  unit: {description: The job's systemd unit., type: str, required: true}
  run_dir: {description: The job's run directory., type: path, required: true}
  run_id_file: {description: "The file root wrote the run's id to; not read when not given.", type: path}
"""

RETURN = r"""
journal: {description: The unit's journal on this node, a line each., type: list, returned: always}
run_id: {description: "The run id file's first line; '' when not given or not there.", type: str, returned: always}
run_dir:
  description: "isdir: a directory and not a link; owner: its owner's name ('' when not a directory or no user's)."
  type: dict
  returned: always
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={"unit": {"type": "str", "required": True},
                       "run_dir": {"type": "path", "required": True},
                       "run_id_file": {"type": "path"}},
        supports_check_mode=True,
    )
    p = module.params
    try:
        lines = journal(p["unit"])
    except subprocess.CalledProcessError as err:
        module.fail_json(msg=f"journalctl could not read {p['unit']}'s journal (exit {err.returncode}): "
                             f"{err.stderr.strip()}")
    module.exit_json(changed=False, journal=lines, run_id=run_id(p["run_id_file"]), run_dir=run_dir(p["run_dir"]))


if __name__ == "__main__":
    main()
