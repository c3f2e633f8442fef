"""The scenarios' "must not reach this task" markers name tasks that exist.

A refusal step (molecule/cluster/tasks/refusal.yml) fails when ansible-playbook printed a
task title it must not reach. A title that no role has any more is never printed, so the
check would pass whatever the playbook did: a renamed task must take its markers along.
"""

import functools
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
# TASK [role : title prefix   or   TASK [role   (any task of the role)
MARKER = re.compile(r"TASK \[(?P<role>[a-z_]+)(?: : (?P<title>[^\]\"'\n]+))?")


def task_names(node: object) -> Iterator[str]:
    """Every task name in a tasks file, blocks included."""
    if isinstance(node, list):
        for item in node:
            yield from task_names(item)
    elif isinstance(node, dict):
        if isinstance(node.get("name"), str):
            yield node["name"]
        for key in ("block", "rescue", "always"):
            yield from task_names(node.get(key))


# Read once per role: every marker of a role asks the same.
@functools.cache
def role_titles(role: str) -> tuple[str, ...]:
    titles: list[str] = []
    for path in sorted((REPO / "roles" / role / "tasks").glob("*.yml")):
        titles += task_names(yaml.safe_load(path.read_text()))
    return tuple(titles)


def markers() -> list[tuple[str, str, str | None]]:
    found = []
    for path in sorted((REPO / "molecule").rglob("*.yml")):
        for m in MARKER.finditer(path.read_text()):
            found.append((str(path.relative_to(REPO)), m["role"], m["title"]))
    return found


def names_a_task(role: str, title: str | None) -> bool:
    """Whether some task of `role` prints as TASK [role : title...]; any task for no title."""
    # A title's literal part: the text before its first Jinja expression.
    literal = [t.split("{{")[0] for t in role_titles(role)]
    if not title:
        return bool(literal)
    title = title.rstrip()
    return any(t.startswith(title) or (t and title.startswith(t)) for t in literal)


def test_the_scenarios_have_markers_to_check():
    assert len(markers()) >= 5


def test_every_marker_names_a_task_of_its_role():
    missing = [f"{where}: TASK [{role}{' : ' + title if title else ''}"
               for where, role, title in markers() if not names_a_task(role, title)]
    assert missing == [], f"markers that name no task (renamed?): {missing}"


def test_a_title_no_task_has_is_caught():
    assert names_a_task("torchrun", "Write the job's files on the node")
    assert names_a_task("package_source", "Push")
    assert names_a_task("common", None)
    assert not names_a_task("torchrun", "Create the job's run directory")
    assert not names_a_task("no_such_role", None)
