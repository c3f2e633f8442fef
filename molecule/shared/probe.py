#!/usr/bin/env python3
"""Socket probe for the firewall and cluster scenarios.

probe.py serve PORTFILE PORT...   listen on each PORT and on one port the
                                  kernel picks (bind to 0, written to PORTFILE);
                                  echo whatever a client sends
probe.py connect HOST PORT...     try each port at once; print JSON
                                  {port: {"result": open|refused|timeout,
                                          "local_port": N, "echo": bool}}
"""

import json
import os
import socket
import sys
import threading

TIMEOUT = 4.0


def echo(conn):
    with conn:
        data = conn.recv(1024)
        if data:
            conn.sendall(data)


def listen(sock):
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()


def serve(portfile, ports):
    socks = []
    for port in ports + [0]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))
        sock.listen(16)
        socks.append(sock)
    with open(portfile + ".tmp", "w") as f:
        f.write(str(socks[-1].getsockname()[1]))
    os.replace(portfile + ".tmp", portfile)
    threads = [threading.Thread(target=listen, args=(s,), daemon=True) for s in socks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def connect(host, port, results):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(TIMEOUT)
    try:
        sock.connect((host, port))
    except TimeoutError:
        results[port] = {"result": "timeout"}
        return
    except ConnectionRefusedError:
        results[port] = {"result": "refused"}
        return
    except OSError as exc:
        results[port] = {"result": f"error: {exc}"}
        return
    result = {"result": "open", "local_port": sock.getsockname()[1], "echo": False}
    if port != 22:
        message = b"torchrig %d" % port
        try:
            sock.sendall(message)
            result["echo"] = sock.recv(1024) == message
        except OSError:
            pass
    sock.close()
    results[port] = result


def main():
    if sys.argv[1] == "serve":
        serve(sys.argv[2], [int(p) for p in sys.argv[3:]])
    else:
        results = {}
        threads = [threading.Thread(target=connect, args=(sys.argv[2], int(p), results)) for p in sys.argv[3:]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    main()
