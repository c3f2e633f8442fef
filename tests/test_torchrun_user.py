"""Each job's own user (roles/torchrun/filter_plugins/torchrun_user.py): a valid user name
for every valid job name, never the same for two jobs, and the uid range it is made in."""

from __future__ import annotations

import re

import pytest
from rolepy import load

user = load("roles/torchrun/filter_plugins/torchrun_user.py", "torchrun_user")

# What useradd accepts everywhere (no Debian relaxation needed) and systemd's User= too.
PORTABLE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # torchrig_job_name_pattern


@pytest.mark.parametrize("job", [
    "mnist", "cluster-mnist", "A", "0", "My.Job_2", "x" * 64, "9" * 64, "...a", "a.b.c-d_e",
    "UPPER", "-", "_x",
])
def test_every_job_name_gives_a_portable_user_name(job):
    name = user.job_user(job)
    assert PORTABLE.fullmatch(name), name
    assert name.startswith("tj-")


def test_the_name_keeps_the_readable_part_of_the_job():
    assert user.job_user("cluster-mnist").startswith("tj-cluster-mnist-")
    assert user.job_user("My.Job").startswith("tj-my-job-")


@pytest.mark.parametrize(("a", "b"), [
    ("a.b", "a-b"), ("Mnist", "mnist"), ("x" * 40, "x" * 41), ("job_1", "job-1"),
])
def test_job_names_that_read_alike_get_users_of_their_own(a, b):
    assert user.job_user(a) != user.job_user(b)


def test_the_same_job_gets_the_same_user_on_every_run():
    assert user.job_user("cluster-mnist") == user.job_user("cluster-mnist")


@pytest.mark.parametrize("job", ["", None, 7])
def test_no_job_name_is_refused(job):
    with pytest.raises(user.JobUserError, match="job name"):
        user.job_user(job)


def test_uid_range():
    assert user.uid_range("59000-59999") == [59000, 59999]
    assert user.uid_range(" 59000 - 59000 ") == [59000, 59000]


@pytest.mark.parametrize("spec", ["59999-59000", "0-999", "500-60000", "59000", "a-b", "59000-59999\n1"])
def test_a_bad_uid_range_is_refused_naming_the_setting(spec):
    with pytest.raises(user.JobUserError, match="torchrig_job_uids must be a range"):
        user.uid_range(spec)
