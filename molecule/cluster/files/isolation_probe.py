"""Connect to each HOST:PORT given and print {endpoint: "open" | error class} as JSON.

molecule/cluster/tasks/isolation.yml runs it as users other than a job's, and as the
job's own user, against the job's rendezvous store and its workers' ports.
"""

from __future__ import annotations

import json
import socket
import sys


def probe(endpoint: str) -> str:
    host, port = endpoint.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            return "open"
    except OSError as error:
        return type(error).__name__


if __name__ == "__main__":
    print(json.dumps({endpoint: probe(endpoint) for endpoint in sys.argv[1:]}))
