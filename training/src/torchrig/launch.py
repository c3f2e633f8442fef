"""torchrun, with a name and an end for a job whose nodes do not all come.

    python -m torchrig.launch [torchrun's options] ENTRY [ARGS...]

The job unit (torchrig-job@.service) starts this instead of the torchrun script. It is
torchrun (torch.distributed.run.main), except that a rendezvous that times out ends the
job for good: torchrun exits 1 for it, as for any failure, and systemd restarted the
unit, so a node that never came back kept the others waiting at rendezvous forever
(every join_timeout seconds, one restart more). Here the job ends with exit status
NODES_MISSING, which the unit does not restart, with a message that names the nodes that
did not join and ENDED_FILE in the run directory saying the same for train.yml.

The nodes that did join are read from the rendezvous state that torchrun's dynamic
rendezvous keeps (its participants and their heartbeats, by the address each node gave
with --local-addr); the job's environment lists the job's nodes as name=address pairs
(torchrig.contract.ENV).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from torchrig import contract

NODES_MISSING = contract.EXIT_NODES_MISSING
ENDED_FILE = contract.FILES["ended"]
ENV = contract.ENV

_seen_addresses: set[str] = set()


def job_nodes(spec: str) -> dict[str, str]:
    """The job's nodes ("node1=10.0.0.1 node2=10.0.0.2") as {name: address}."""
    nodes = {}
    for item in spec.split():
        name, sep, address = item.partition("=")
        if sep and name and address:
            nodes[name] = address
    return nodes


def missing_nodes(nodes: dict[str, str], joined: set[str], this_address: str) -> list[str]:
    """The job's nodes whose address is not among those that joined (this node has)."""
    present = set(joined) | {this_address}
    return [name for name, address in nodes.items() if address not in present]


def alive_addresses(last_heartbeats: dict, now: datetime, expiry: timedelta) -> set[str]:
    """Addresses of the nodes whose newest heartbeat is younger than `expiry`.

    A node that died after it joined stays among the rendezvous' participants until
    torch removes it, so only a recent heartbeat counts as being there.
    """
    return {node.addr for node, beat in last_heartbeats.items() if now - beat < expiry}


def _remember_joined(handler: object) -> None:
    """Keep the addresses of the nodes alive in the rendezvous (private torch state)."""
    try:
        state = handler._state_holder.state  # type: ignore[attr-defined]
        settings = handler._settings  # type: ignore[attr-defined]
        # torch's own rule for a dead node (DynamicRendezvousHandler's _remove_dead_nodes).
        expiry = settings.keep_alive_interval * settings.keep_alive_max_attempt
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        _seen_addresses.update(alive_addresses(state.last_heartbeats, now, expiry))
    except Exception:  # noqa: BLE001 - naming nodes is a courtesy; never fail the job for it
        pass


def _watch_rendezvous() -> None:
    """Record who joined each time a rendezvous attempt ends, successful or not."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    original = dr.DynamicRendezvousHandler.next_rendezvous

    def next_rendezvous(self):  # type: ignore[no-untyped-def]
        _seen_addresses.clear()
        try:
            return original(self)
        finally:
            _remember_joined(self)

    dr.DynamicRendezvousHandler.next_rendezvous = next_rendezvous


def report_missing(run_dir: Path, waited_s: float) -> str:
    nodes = job_nodes(os.environ.get(ENV["nodes"], ""))
    this = os.environ.get(ENV["local_addr"], "")
    missing = missing_nodes(nodes, _seen_addresses, this) or sorted(set(nodes) - {
        name for name, address in nodes.items() if address == this})
    timeout = os.environ.get(ENV["join_timeout"], "?")
    message = (f"torchrig: job {os.environ.get(ENV['job'], '?')} ends: "
               f"{', '.join(missing) or 'a node'} did not join within {timeout} s "
               f"(join_timeout); the job's nodes: {', '.join(nodes) or '?'}. "
               "Start it again with train.yml once every node is back; it resumes from its "
               "newest checkpoint.")
    record = {"kind": "nodes missing", "missing": missing, "nodes": list(nodes),
              "join_timeout_s": timeout, "time": time.time(), "waited_s": round(waited_s, 1),
              "lines": [message]}
    try:
        (run_dir / ENDED_FILE).write_text(json.dumps(record, indent=1) + "\n")
    except OSError as e:
        message += f" (could not write {run_dir / ENDED_FILE}: {e})"
    return message


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError
    from torch.distributed.run import main as torchrun_main

    _watch_rendezvous()
    run_dir = Path(os.environ.get(ENV["run_dir"], "."))
    start = time.monotonic()
    try:
        torchrun_main(sys.argv[1:] if argv is None else argv)
    except RendezvousTimeoutError:
        print(report_missing(run_dir, time.monotonic() - start), file=sys.stderr, flush=True)
        return NODES_MISSING
    return 0


if __name__ == "__main__":
    sys.exit(main())
