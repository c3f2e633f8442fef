"""Clock offset between two nodes, measured the way NTP does.

    python -m torchrig.clock_offset serve --port 51991 --clients 2      # on the reference node
    python -m torchrig.clock_offset query --host node1 --port 51991     # on every node

The client sends its time t0, the server answers with its time ts, the
client reads t1 on arrival. Assuming the two halves of the round trip take
equally long, offset = ts - (t0 + t1) / 2, wrong by at most (t1 - t0) / 2.
Of several exchanges the one with the shortest round trip is kept: its
error bound is the smallest. Asking "what time is it?" over SSH instead
measures the connection's latency (seconds on a busy controller), not the
clocks.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time
from collections.abc import Callable

from .config import number

_STAMP = struct.Struct("!d")


def serve(port: int, clients: int, timeout: float, clock: Callable[[], float] = time.time) -> int:
    """Answer each 8-byte request with this node's time until `clients` connections have closed.

    `clock` is replaceable so that a test can serve a clock that is off by a known amount.
    """
    deadline = time.monotonic() + timeout
    with socket.create_server(("", port), family=socket.AF_INET, reuse_port=False) as server:
        served = 0
        while served < clients:
            left = deadline - time.monotonic()
            if left <= 0:
                print(f"clock_offset: {served} of {clients} clients within {timeout:.0f} s",
                      file=sys.stderr)
                return 1
            server.settimeout(left)
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            answered = 0
            with conn:
                conn.settimeout(max(deadline - time.monotonic(), 0.1))
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while request := conn.recv(_STAMP.size):
                    if len(request) != _STAMP.size:
                        break
                    conn.sendall(_STAMP.pack(clock()))
                    answered += 1
            # A port probe (connect, then close) is not a client.
            served += answered > 0
    return 0


def measure(host: str, port: int, count: int, timeout: float) -> dict[str, float]:
    """The server clock's offset from ours (positive: it is ahead), and its error bound."""
    best: tuple[float, float] | None = None  # (round trip, offset)
    with socket.create_connection((host, port), timeout=timeout) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            t0 = time.time()
            conn.sendall(_STAMP.pack(t0))
            reply = b""
            while len(reply) < _STAMP.size:
                chunk = conn.recv(_STAMP.size - len(reply))
                if not chunk:
                    raise ConnectionError(f"{host}:{port} closed the connection")
                reply += chunk
            t1 = time.time()
            (ts,) = _STAMP.unpack(reply)
            rtt = t1 - t0
            if best is None or rtt < best[0]:
                best = (rtt, ts - (t0 + t1) / 2)
    assert best is not None
    return {"offset_s": best[1], "error_s": best[0] / 2, "rtt_s": best[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchrig.clock_offset",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="answer time requests (on the reference node)")
    s.add_argument("--port", type=number(int, 1), required=True)
    s.add_argument("--clients", type=number(int, 1), default=1, help="exit after this many clients")
    s.add_argument("--timeout", type=float, default=60.0, help="give up after this many seconds")
    q = sub.add_parser("query", help="measure this node's offset from the server, print JSON")
    q.add_argument("--host", required=True)
    q.add_argument("--port", type=number(int, 1), required=True)
    q.add_argument("--count", type=number(int, 1), default=20, help="exchanges; the fastest counts")
    q.add_argument("--timeout", type=float, default=10.0)
    args = p.parse_args(argv)
    if args.command == "serve":
        return serve(args.port, args.clients, args.timeout)
    try:
        result = measure(args.host, args.port, args.count, args.timeout)
    except OSError as e:
        print(f"clock_offset: cannot measure against {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
