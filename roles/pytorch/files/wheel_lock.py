"""The wheelhouse lock: which wheel files, by sha256, a cluster installs.

A lock (`torchrig-lock.txt` in a wheelhouse, or a committed one in
roles/pytorch/files/locks/) is a pip requirements file that pins every wheel of
the wheelhouse: one line per package, `name==version --hash=sha256:<hex>`
(names normalised per PEP 503, lines sorted), under `# key: value` header
lines that say what it was made for. Nodes install it with

    pip install --no-index --no-deps --require-hashes -r torchrig-lock.txt --find-links DIR

so pip refuses any file whose hash differs. This module is the one place that
reads and writes that format; fill_wheelhouse.py (on the controller) imports it.
It is plain Python 3.10+ with the standard library only, because it also runs
on the nodes' system python3.

usage:
  python wheel_lock.py check --lock LOCK --dir DIR [--hint TEXT]
      Compares every wheel in DIR with LOCK. Exit 0 and one JSON line
      {"lock", "dir", "wheels", "bytes", "seconds"} when they match; exit 1 and
      one line per problem (ALTERED / MISSING / EXTRA, naming the file, the
      package, the expected and found sha256, and what to do) when not; exit 2
      when LOCK cannot be read.
  python wheel_lock.py explain [--hint TEXT] < pip-output
      Reads pip's output; when pip refused files for their hashes ("THESE
      PACKAGES DO NOT MATCH THE HASHES"), prints one line per refused wheel
      (package, file, expected and got sha256, what to do) and exits 0;
      otherwise prints nothing and exits 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
import urllib.parse
from dataclasses import dataclass, field

LOCK_FILENAME = "torchrig-lock.txt"
CHUNK = 1 << 20  # 1 MiB reads: a 2.9 GiB wheelhouse (59 wheels) hashed in 3.2 s on the controller

DEFAULT_CHECK_HINT = "remove the wheelhouse directory {dir} so that provision.yml downloads it again"
DEFAULT_EXPLAIN_HINT = (
    "the pushed wheel is not the locked file (altered or corrupted); remove the controller's wheelhouse "
    "directory for this stack (~/.cache/torchrig/wheelhouse/...) so that provision.yml downloads it again"
)

_LINE = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)(?P<hashes>(?:\s+--hash=sha256:[0-9a-f]{64})+)\s*$"
)
_HEADER = re.compile(r"^#\s*(?P<key>[a-z][a-z-]*):\s?(?P<value>.*)$")


class LockError(Exception):
    """A lock that cannot be read or written; the message names the file."""


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of '-', '_', '.' as one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    """One lock line: a package at one version and the sha256 of its allowed files."""

    name: str
    version: str
    hashes: tuple[str, ...]

    def line(self) -> str:
        return f"{self.name}=={self.version}" + "".join(f" --hash=sha256:{h}" for h in self.hashes)


@dataclass
class Lock:
    """A parsed lock: header fields (`# key: value`) and pins by normalised name."""

    header: dict[str, str] = field(default_factory=dict)
    pins: dict[str, Pin] = field(default_factory=dict)


def parse_line(line: str) -> Pin | None:
    """The pin on one line, None for blank and comment lines; ValueError when malformed."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    m = _LINE.match(text)
    if not m:
        raise ValueError(f"not `name==version --hash=sha256:<hex>`: {text!r}")
    hashes = tuple(re.findall(r"--hash=sha256:([0-9a-f]{64})", m["hashes"]))
    return Pin(normalize(m["name"]), m["version"], hashes)


def parse(text: str, source: str = "<lock>") -> Lock:
    """Parse a whole lock; LockError names source and line for anything malformed."""
    lock = Lock()
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line.strip())
        if header:
            lock.header[header["key"]] = header["value"].strip()
            continue
        try:
            pin = parse_line(line)
        except ValueError as e:
            raise LockError(f"{source}:{number}: {e}") from None
        if pin is None:
            continue
        if pin.name in lock.pins:
            # pip refuses a second line for one package ("Double requirement given").
            raise LockError(f"{source}:{number}: {pin.name} is pinned twice")
        lock.pins[pin.name] = pin
    return lock


def read(path: str) -> Lock:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise LockError(f"cannot read the lock {path}: {e.strerror}") from None
    return parse(text, path)


def render(header: dict[str, str], pins: list[Pin]) -> str:
    """The lock's text: header lines, then the pins sorted by name."""
    lines = [f"# {key}: {value}".rstrip() for key, value in header.items()]
    lines += [pin.line() for pin in sorted(pins, key=lambda p: p.name)]
    return "\n".join(lines) + "\n"


def wheel_name_version(filename: str) -> tuple[str, str]:
    """(normalised name, version) from a wheel's file name (PEP 427: name-ver[-build]-py-abi-plat.whl)."""
    parts = filename[: -len(".whl")].split("-")
    if not filename.endswith(".whl") or len(parts) not in (5, 6):
        raise ValueError(f"{filename} is not a wheel file name")
    return normalize(parts[0]), parts[1]


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def wheels(directory: str) -> list[str]:
    """The wheel file names in a directory, sorted (the lock and anything else are not wheels)."""
    return sorted(f for f in os.listdir(directory) if f.endswith(".whl"))


def pins_for_dir(directory: str) -> list[Pin]:
    """A pin for every wheel in directory: what fill_wheelhouse writes into a fresh wheelhouse.

    Files of one package at one version (two platform builds) share a line with
    both hashes; two versions of one package cannot be locked, so that is an error.
    """
    found: dict[str, tuple[str, list[str], list[str]]] = {}
    for filename in wheels(directory):
        name, version = wheel_name_version(filename)
        digest = sha256_file(os.path.join(directory, filename))
        if name in found and found[name][0] != version:
            raise LockError(
                f"{directory} holds two versions of {name} ({found[name][2][0]} and {filename}); "
                "a lock pins one: the pip downloads resolved it differently, pin the version wanted "
                "in the package lists"
            )
        found.setdefault(name, (version, [], []))
        found[name][1].append(digest)
        found[name][2].append(filename)
    return [Pin(name, version, tuple(sorted(hashes))) for name, (version, hashes, _) in found.items()]


def write(path: str, header: dict[str, str], pins: list[Pin]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(header, pins))


def check_dir(lock: Lock, directory: str, hint: str) -> tuple[list[str], dict[str, int]]:
    """Problems (one line each) between the lock and the wheels in directory, and counts."""
    problems: list[str] = []
    seen: set[str] = set()
    count = total = 0
    for filename in wheels(directory):
        count += 1
        path = os.path.join(directory, filename)
        try:
            name, version = wheel_name_version(filename)
        except ValueError:
            problems.append(f"EXTRA {path}: not a wheel file name and not in the lock; {hint}")
            continue
        digest = sha256_file(path)
        total += os.path.getsize(path)
        pin = lock.pins.get(name)
        if pin is None or pin.version.lower() != version.lower():
            pinned = f"the lock pins {name}=={pin.version}" if pin else f"the lock has no {name}"
            problems.append(
                f"EXTRA {path}: package {name} {version} is not in the lock ({pinned}); found sha256 {digest}; {hint}"
            )
            continue
        seen.add(name)
        if digest not in pin.hashes:
            problems.append(
                f"ALTERED {path}: package {name} {version}: expected sha256 {' or '.join(pin.hashes)}, "
                f"found sha256 {digest}; {hint}"
            )
    for name, pin in sorted(lock.pins.items()):
        if name not in seen:
            problems.append(
                f"MISSING {os.path.join(directory, f'{name}-{pin.version}-*.whl')}: package {name} {pin.version} "
                f"is locked (expected sha256 {' or '.join(pin.hashes)}) but no wheel of it is in {directory}; {hint}"
            )
    return problems, {"wheels": count, "bytes": total}


# pip reports a refused file as (HashMismatch; checked with pip 23.0.1, Debian 12's, and 23.2.1):
#   THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. ...
#       torch==2.14.1 from file:///dir/torch-2.14.1-....whl (from -r lock (line 5)):
#           Expected sha256 1234...
#           Expected     or 5678...      (one per further allowed hash)
#                Got        abcd...
_MISMATCH = "THESE PACKAGES DO NOT MATCH THE HASHES"
_REQ = re.compile(r"^\s{4}(?!Expected|Got)(?P<req>\S+)(?P<rest>.*):\s*$")
_URL = re.compile(r" from (?P<url>[a-z+]+://\S+)")
_EXPECTED = re.compile(r"^\s+Expected\s+(?:sha256|or)\s+(?P<hex>[0-9a-f]{64})\s*$")
_GOT = re.compile(r"^\s+Got\s+(?P<hex>[0-9a-f]{64})\s*$")


def explain(pip_output: str, hint: str) -> list[str]:
    """One line per wheel pip refused for its hash; [] when pip reported no hash mismatch."""
    if _MISMATCH not in pip_output:
        return []
    lines: list[str] = []
    req = url = ""
    expected: list[str] = []
    for line in pip_output[pip_output.index(_MISMATCH):].splitlines()[1:]:
        m = _REQ.match(line)
        if m:
            url_match = _URL.search(m["rest"])
            req, url, expected = m["req"], url_match["url"] if url_match else "", []
            continue
        m = _EXPECTED.match(line)
        if m:
            expected.append(m["hex"])
            continue
        m = _GOT.match(line)
        if m and req:
            package = re.split(r"[=<>!~ ;\[]", req, maxsplit=1)[0]
            filename = urllib.parse.unquote(os.path.basename(urllib.parse.urlparse(url).path)) if url else "?"
            lines.append(
                f"REFUSED {filename}: package {normalize(package)} ({req}): expected sha256 "
                f"{' or '.join(expected)}, got sha256 {m['hex']}; {hint}"
            )
            req = ""
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="compare the wheels in a directory with a lock")
    c.add_argument("--lock", required=True)
    c.add_argument("--dir", required=True)
    c.add_argument("--hint", default=DEFAULT_CHECK_HINT, help="what to do, after each problem ({dir} is replaced)")
    e = sub.add_parser("explain", help="name the wheels pip refused for their hashes (pip's output on stdin)")
    e.add_argument("--hint", default=DEFAULT_EXPLAIN_HINT, help="what to do, after each refused wheel")
    a = p.parse_args(argv)

    if a.command == "explain":
        lines = explain(sys.stdin.read(), a.hint)
        for line in lines:
            print(line)
        return 0 if lines else 1

    start = time.monotonic()
    try:
        lock = read(a.lock)
        problems, counts = check_dir(lock, a.dir, a.hint.replace("{dir}", a.dir))
    except (LockError, OSError) as err:
        print(f"wheel_lock: {err}", file=sys.stderr)
        return 2
    if not lock.pins:
        problems.insert(0, f"EMPTY {a.lock}: the lock pins no wheel; {a.hint.replace('{dir}', a.dir)}")
    for problem in problems:
        print(problem)
    if problems:
        return 1
    summary = {"lock": a.lock, "dir": a.dir, **counts, "seconds": round(time.monotonic() - start, 2)}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
