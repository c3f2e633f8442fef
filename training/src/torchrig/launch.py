"""torchrun, with a name and an end for a job whose nodes do not all come.

    python -m torchrig.launch [torchrun's options] ENTRY [ARGS...]

The job unit (torchrig-job@.service) starts this instead of the torchrun script. It is
torchrun (torch.distributed.run.main), except that a rendezvous that times out ends the
job for good: torchrun exits 1 for it, as for any failure, and systemd restarted the
unit, so a node that never came back kept the others waiting at rendezvous forever
(every join_timeout seconds, one restart more). Here the job ends with exit status
NODES_MISSING, which the unit does not restart, with a message that names the nodes that
did not join and ENDED_FILE in the run directory saying the same for train.yml.

A node whose workers fail after the other nodes' workers have finished for good (a script
that crashes in its last barrier or while saving, its peers already done) cannot be
restarted either: torchrun's restart waits at rendezvous for nodes that never come, until
join_timeout. At that restart, the nodes that finished are seen in torchrun's exit barrier
(which an agent enters only after its workers succeeded), and the job ends at once with
the same exit status, ENDED_FILE holding the worker's own traceback (from
FAILURE_FILE, torchrig.worker); this node checks into the exit barrier, so that the
finished nodes leave it at once instead of after its timeout.

When the kernel ended some of the job's processes at its memory limit (the unit's
MemoryMax=), torchrun sees only a worker killed by SIGKILL; this says so in the journal,
with the limit, when torchrun ends (memory_note).

The nodes that did join are read from the rendezvous state that torchrun's dynamic
rendezvous keeps (its participants and their heartbeats, by the address each node gave
with --local-addr); the job's environment lists the job's nodes as name=address pairs
(torchrig.contract.ENV).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from datetime import datetime, timedelta, timezone
from pathlib import Path

from torchrig import contract

NODES_MISSING = contract.EXIT_NODES_MISSING
ENDED_FILE = contract.FILES["ended"]
FAILURE_FILE = contract.FILES["failure"]
ENV = contract.ENV

_seen_addresses: set[str] = set()
# The last rendezvous round's store and number of nodes: at a restart, who finished.
_last_round: dict = {}


class PeersFinished(Exception):
    """The workers failed here after `finished` of the other nodes had finished for good."""

    def __init__(self, finished: int, nodes: int) -> None:
        super().__init__(f"{finished} of the other {nodes - 1} nodes finished")
        self.finished, self.nodes = finished, nodes


def _exit_barrier_keys() -> tuple[str, str] | None:
    """torchrun's exit barrier keys (private torch names): the count of agents whose
    workers succeeded, and the key its last member sets. None if torch has other names."""
    try:
        from torch.distributed.elastic.agent.server import api
        from torch.distributed.elastic.utils import store as store_util
        prefix = api._TERMINAL_STATE_SYNC_ID
        return prefix + store_util._NUM_MEMBERS, prefix + store_util._LAST_MEMBER_CHECKIN
    except (ImportError, AttributeError):
        return None


def finished_nodes(store: object, keys: tuple[str, str]) -> int:
    """How many agents of the round have entered the exit barrier: their workers succeeded,
    and they will not join another round."""
    return int(store.add(keys[0], 0))  # type: ignore[attr-defined]


def check_in(store: object, keys: tuple[str, str], nodes: int) -> None:
    """Enter the exit barrier as torchrun's own agents do, so that the nodes waiting
    there leave it now rather than after exit_barrier_timeout."""
    if int(store.add(keys[0], 1)) >= nodes:  # type: ignore[attr-defined]
        store.set(keys[1], "<val_ignored>")  # type: ignore[attr-defined]


def _remember_round(info: object) -> None:
    """Keep the round's store and node count (RendezvousInfo, or an older torch's tuple)."""
    store = getattr(info, "store", None)
    nodes = getattr(info, "world_size", None)
    if store is None and isinstance(info, tuple) and len(info) == 3:
        store, _, nodes = info
    if store is not None and nodes:
        _last_round.update(store=store, nodes=int(nodes))


def _end_if_peers_finished() -> None:
    """At a restart: when another node has finished for good, it will not join again."""
    keys = _exit_barrier_keys()
    if not _last_round or keys is None or _last_round["nodes"] < 2:
        return
    store = _last_round["store"]
    try:
        finished = finished_nodes(store, keys)
    except Exception:  # noqa: BLE001 - the store gone or torch changed: restart as before
        return
    if finished > 0:
        # Failing here only costs the finished nodes their wait to exit_barrier_timeout.
        with contextlib.suppress(Exception):
            check_in(store, keys, _last_round["nodes"])
        raise PeersFinished(finished, _last_round["nodes"])


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
        _end_if_peers_finished()
        _seen_addresses.clear()
        try:
            info = original(self)
        finally:
            _remember_joined(self)
        _remember_round(info)
        return info

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


def report_failed_after_peers(run_dir: Path, error: PeersFinished, started: float) -> str:
    """Write ENDED_FILE for a failure after the other nodes finished: the worker's own
    traceback (FAILURE_FILE, when written during this launch), then what happened."""
    try:
        failure = json.loads((run_dir / FAILURE_FILE).read_text())
    except (OSError, ValueError):
        failure = {}
    fresh = isinstance(failure, dict) and float(failure.get("time", 0)) >= started
    lines = failure.get("lines", []) if fresh else []
    job = os.environ.get(ENV["job"], "?")
    message = (f"torchrig: job {job} ends: its workers here failed after the other nodes "
               f"had finished for good ({error.finished} of {error.nodes - 1}), so no restart "
               "could bring them back. Fix the error above and start the job again with "
               "train.yml; it resumes from its newest checkpoint.")
    record = {"kind": "failed after the other nodes finished", "nodes": error.nodes,
              "finished": error.finished, "time": time.time(),
              "rank": failure.get("rank") if fresh else None, "lines": [*lines, message]}
    try:
        (run_dir / ENDED_FILE).write_text(json.dumps(record, indent=1) + "\n")
    except OSError as e:
        message += f" (could not write {run_dir / ENDED_FILE}: {e})"
    return "\n".join([*lines, message])


def memory_note(cgroups: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup"),
                host: str = "") -> str:
    """A line for the journal when the kernel ended processes of this job at its memory limit,
    else ''.

    The job's unit is one cgroup, whose memory controller counts those kills: `oom_kill` in
    memory.oom_control on cgroup v1 (a hybrid host's too: the controller is there), in
    memory.events on cgroup v2. Nothing readable, nothing said.
    """
    try:
        lines = cgroups.read_text().splitlines()
    except OSError:
        return ""
    paths = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                paths[controller] = parts[2].lstrip("/")
    if "memory" in paths:
        where = root / "memory" / paths["memory"]
        counts, limit_file = where / "memory.oom_control", where / "memory.limit_in_bytes"
    elif "" in paths:
        where = root / paths[""]
        counts, limit_file = where / "memory.events", where / "memory.max"
    else:
        return ""
    try:
        kills = next((int(line.split()[1]) for line in counts.read_text().splitlines()
                      if line.startswith("oom_kill ")), 0)
        limit = limit_file.read_text().strip()
    except (OSError, ValueError, IndexError):
        return ""
    if kills <= 0:
        return ""
    # cgroup v1 says "no limit" with the largest page-aligned number; v2 with "max".
    limited = limit.isdigit() and int(limit) < 1 << 60
    what = (f"at the job's memory limit ({int(limit) / 2**20:.0f} MiB, torchrun_memory_max)"
            if limited else "with the node out of memory (the job has no memory limit)")
    job = os.environ.get(ENV["job"], "?")
    return (f"{contract.MEMORY_NOTE} the kernel ended {kills} of job {job}'s processes on "
            f"{host or os.uname().nodename} {what}. "
            "A worker ended so fails with SIGKILL (exitcode -9), and torchrun restarts the "
            "workers from the newest checkpoint while it may: give the job more memory, or use "
            "less (a smaller batch, fewer DataLoader workers).")


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError
    from torch.distributed.run import main as torchrun_main

    _watch_rendezvous()
    run_dir = Path(os.environ.get(ENV["run_dir"], "."))
    start = time.monotonic()
    started = time.time()
    try:
        torchrun_main(sys.argv[1:] if argv is None else argv)
    except RendezvousTimeoutError:
        print(report_missing(run_dir, time.monotonic() - start), file=sys.stderr, flush=True)
        return NODES_MISSING
    except PeersFinished as e:
        print(report_failed_after_peers(run_dir, e, started), file=sys.stderr, flush=True)
        return NODES_MISSING
    except ChildFailedError:
        # Its traceback first, as Python would print it, so that the note is the last line.
        traceback.print_exc()
        print_memory_note()
        return 1
    print_memory_note()
    return 0


def print_memory_note() -> None:
    note = memory_note()
    if note:
        print(note, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
