"""The cluster's nodes worth asking about a job: those whose SSH port answers.

train.yml asks the cluster's other nodes whether a job of its name runs there
(tasks/cluster_job.yml). A task delegated to a node that is down fails the play
even with ignore_unreachable, so the nodes are tried first. They are tried all at
once, each for at most `timeout` seconds: one node that is down costs a launch
`timeout` seconds, and ten cost the same, where one wait_for per node cost five
seconds each.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: torchrun_answering
short_description: The inventory hosts whose SSH port accepts a connection
description:
  - Returns the names among the terms that are worth a delegated task, in their order. A
    host reached other than by SSH (ansible_connection local, podman, ...) is returned as it
    is; a host reached by SSH is returned when a TCP connection to its ansible_host (its name
    when unset) and ansible_port (22 when unset) opens within the timeout. All hosts are
    tried at once.
options:
  _terms: {description: Inventory host names., required: true}
  timeout: {description: Seconds each host has to accept the connection., type: float, default: 2}
"""

RETURN = r"""
_raw:
  description: The names that answered, and those not reached by SSH.
  type: list
  elements: str
"""

import socket  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

from ansible.errors import AnsibleLookupError  # noqa: E402
from ansible.plugins.lookup import LookupBase  # noqa: E402

# More threads than this gain nothing: a launch does not wait on a hundred nodes at once.
MAX_THREADS = 64


def port_answers(host: str, port: int, timeout: float) -> bool:
    """Whether a TCP connection to host:port opens within timeout seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def answering(targets: dict[str, tuple[str, int] | None], timeout: float) -> list[str]:
    """The names whose (host, port) answers, in order; a None target is not tried and counts."""
    tried = {name: target for name, target in targets.items() if target is not None}
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_THREADS, len(tried)))) as pool:
        answers = dict(zip(tried, pool.map(lambda t: port_answers(t[0], t[1], timeout), tried.values()), strict=True))
    return [name for name in targets if targets[name] is None or answers[name]]


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        hostvars = (variables or {}).get("hostvars", {})
        targets: dict[str, tuple[str, int] | None] = {}
        for name in terms:
            if name not in hostvars:
                raise AnsibleLookupError(f"torchrun_answering: {name!r} is not a host of the inventory")
            host = hostvars[name]
            if str(host.get("ansible_connection", "ssh")) not in ("ssh", "ansible.builtin.ssh"):
                targets[str(name)] = None
                continue
            port = host.get("ansible_port", 22)
            try:
                targets[str(name)] = (str(host.get("ansible_host", name)), int(port))
            except (TypeError, ValueError):
                raise AnsibleLookupError(f"{name}: ansible_port must be a number, got {port!r}") from None
        return answering(targets, float(self.get_option("timeout")))
