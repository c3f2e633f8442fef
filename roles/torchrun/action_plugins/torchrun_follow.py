"""Follow a job's journal on a node live (playbooks/logs.yml -e follow=true), in one task.

Ansible shows a task's output when it ends; this action prints each new journal line as it
comes, from every node at once (one worker per node), until the job's unit no longer runs
there or the user interrupts (Ctrl-C). Each poll asks systemd for the unit's state first,
then for the journal after the last cursor, so no line written before the unit ended is
missed. The lines come from the node: control characters are replaced before they reach
the terminal.
"""

from __future__ import annotations

import re
import shlex
import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()
RUNNING = ("active", "activating", "deactivating", "reloading")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x9b]")
CURSOR = "-- cursor: "


def clean(line: str) -> str:
    """A journal line safe for a terminal: no escape sequences, no carriage returns."""
    return CONTROL.sub("?", line)


def parse(stdout: str) -> tuple[str, list[str], str | None]:
    """(the unit's state, the new journal lines, the journal's cursor after them)."""
    lines = stdout.splitlines()
    state = lines[0].strip() if lines else "unknown"
    cursor = None
    out = []
    for line in lines[1:]:
        if line.startswith(CURSOR):
            cursor = line[len(CURSOR):].strip()
        elif not line.startswith("-- No entries --"):
            out.append(clean(line))
    return state, out, cursor


class ActionModule(ActionBase):
    """torchrun_follow: unit, lines (shown first), poll_interval."""

    _VALID_ARGS = frozenset(("unit", "lines", "poll_interval"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        unit = str(self._task.args["unit"])
        lines = int(self._task.args.get("lines", 20))
        poll = float(self._task.args.get("poll_interval", 1))
        host = task_vars.get("inventory_hostname", "?")
        cursor: str | None = None
        shown = 0
        while True:
            where = f"--after-cursor={shlex.quote(cursor)}" if cursor else f"--lines={lines}"
            cmd = (f"systemctl is-active {shlex.quote(unit)}; journalctl --unit={shlex.quote(unit)} "
                   f"--output=short-iso-precise --no-pager --show-cursor {where}")
            out = self._low_level_execute_command(cmd, sudoable=True)
            state, new, after = parse(out.get("stdout", ""))
            for line in new:
                display.display(line)
            shown += len(new)
            cursor = after or cursor
            if state not in RUNNING:
                break
            time.sleep(poll)
        msg = f"{unit} on {host} is {clean(state)}: the journal ends here ({shown} lines shown)."
        display.display(msg)
        result.update(changed=False, state=state, lines=shown, msg=msg)
        return result
