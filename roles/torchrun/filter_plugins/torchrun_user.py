"""Each job's own user on its nodes, so that one job cannot read another's files or
signal its processes (roles/torchrun/tasks/job_user.yml makes it).

A user name has at most 32 characters and is safest in lower case letters, digits, '_'
and '-'; a job name may have 64 characters, capitals and dots. So the name keeps a
readable part of the job's name and ends with a hash of the whole name: two job names
never share a user. Plain functions, unit-tested in tests/test_torchrun_user.py.
"""

from __future__ import annotations

import hashlib
import re

PREFIX = "tj-"
# PREFIX + readable part + "-" + HASH_CHARS hex digits stays within 32 characters.
READABLE_CHARS = 19
HASH_CHARS = 8
NAME_MAX = 32


class JobUserError(ValueError):
    """A value the job user cannot be made from. Not Ansible's own error class: importing
    Ansible in the test process patches sys.intern, which torch's compiler then refuses."""


def job_user(job: str) -> str:
    """The user a job runs as on every node: tj-<readable part>-<hash of the job name>."""
    if not isinstance(job, str) or not job:
        raise JobUserError(f"A job user needs a job name; got {job!r}.")
    readable = re.sub(r"[^a-z0-9_-]+", "-", job.lower()).strip("-_")[:READABLE_CHARS].strip("-_")
    digest = hashlib.sha256(job.encode()).hexdigest()[:HASH_CHARS]
    name = f"{PREFIX}{readable}-{digest}" if readable else f"{PREFIX}{digest}"
    assert len(name) <= NAME_MAX, name
    return name


def uid_range(spec: str) -> list[int]:
    """[first, last] of a "first-last" uid range, refused unless it is one."""
    match = re.fullmatch(r"\s*([0-9]+)\s*-\s*([0-9]+)\s*", str(spec))
    if not match or not 1000 <= int(match[1]) <= int(match[2]) < 2**31 - 1:
        raise JobUserError(
            f"torchrig_job_uids must be a range 'first-last' of user ids from 1000 up, first <= last "
            f"(got {spec!r}); the jobs' users are made in it and the firewall lets only them open "
            "connections to the training ports.")
    return [int(match[1]), int(match[2])]


class FilterModule:
    def filters(self):
        return {"torchrun_job_user": job_user, "torchrun_uid_range": uid_range}
