#!/usr/bin/env python3
"""What the controller needs to fetch a node's apt packages on its behalf.

Runs on the node (ansible.builtin.script, stdlib only) and prints JSON: the
release and architecture, the node's own (upstream) apt sources with the keys
that sign them, its apt preferences, whether apt installs recommends, and its
dpkg status (gzip + base64). The controller then resolves with apt against the
same sources, keys and status, so it downloads exactly what the node's apt
would: nothing it has, nothing from a source the node does not trust.

torchrig's own source (under /etc/torchrig/apt) is left out: it is the copy,
not the origin.

usage: apt_state.py
"""

from __future__ import annotations

import base64
import glob
import gzip
import json
import os
import re
import subprocess
import sys

SOURCES_LIST = "/etc/apt/sources.list"
SOURCES_DIR = "/etc/apt/sources.list.d"
PREFERENCES = ["/etc/apt/preferences", *sorted(glob.glob("/etc/apt/preferences.d/*"))]
TRUSTED = ["/etc/apt/trusted.gpg", *sorted(glob.glob("/etc/apt/trusted.gpg.d/*.gpg")),
           *sorted(glob.glob("/etc/apt/trusted.gpg.d/*.asc"))]


def read_b64(path: str) -> str:
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


def keys_for(signed_by: str) -> list[dict]:
    """The keys one source is checked against: its Signed-By, else apt's trusted set."""
    signed_by = signed_by.strip()
    if signed_by.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----") or "\n" in signed_by:
        # An inline key (deb822): continuation lines hold it, with "." for empty lines.
        text = "\n".join("" if line.strip() == "." else line.strip() for line in signed_by.splitlines())
        return [{"name": "inline.asc", "b64": base64.b64encode(text.encode()).decode()}]
    if signed_by:
        paths = [p for p in re.split(r"[\s,]+", signed_by) if p.startswith("/")]
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            sys.exit(f"apt_state: a source is signed by {', '.join(missing)}, which does not exist on this node")
        return [{"name": os.path.basename(p), "b64": read_b64(p)} for p in paths]
    return [{"name": os.path.basename(p), "b64": read_b64(p)} for p in TRUSTED if os.path.isfile(p)]


def deb822_paragraphs(text: str) -> list[dict[str, str]]:
    """deb822 paragraphs as field -> value (continuation lines kept, joined by newlines)."""
    paragraphs, fields, last = [], {}, None
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if fields:
                paragraphs.append(fields)
            fields, last = {}, None
            continue
        if line[0] in " \t" and last:
            fields[last] += "\n" + line
            continue
        name, _, value = line.partition(":")
        last = name.strip().lower()
        fields[last] = value.strip()
    if fields:
        paragraphs.append(fields)
    return paragraphs


def from_deb822(path: str) -> list[dict]:
    sources = []
    with open(path) as f:
        for p in deb822_paragraphs(f.read()):
            if p.get("enabled", "yes").strip().lower() == "no" or "deb" not in p.get("types", "").split():
                continue
            sources.append({"uris": p.get("uris", "").split(), "suites": p.get("suites", "").split(),
                            "components": p.get("components", "").split(),
                            "keys": keys_for(p.get("signed-by", "")), "file": path})
    return sources


def from_one_line(path: str) -> list[dict]:
    sources = []
    with open(path) as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if not line.startswith("deb "):
                continue
            options = {}
            match = re.match(r"deb\s+\[([^\]]*)\]\s+(.*)", line)
            rest = line[4:]
            if match:
                options = dict(o.split("=", 1) for o in match.group(1).split() if "=" in o)
                rest = match.group(2)
            uri, suite, *components = rest.split()
            sources.append({"uris": [uri], "suites": [suite], "components": components,
                            "keys": keys_for(options.get("signed-by", "")), "file": path})
    return sources


def apt_config(name: str, default: str) -> str:
    out = subprocess.run(["apt-config", "shell", "V", name], capture_output=True, text=True, check=False).stdout
    match = re.search(r"V='([^']*)'", out)
    return match.group(1) if match else default


def main() -> None:
    sources = []
    if os.path.isfile(SOURCES_LIST):
        sources += from_one_line(SOURCES_LIST)
    for path in sorted(glob.glob(f"{SOURCES_DIR}/*.list")):
        sources += from_one_line(path)
    for path in sorted(glob.glob(f"{SOURCES_DIR}/*.sources")):
        sources += from_deb822(path)
    with open("/etc/os-release") as f:
        os_release = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    with open("/var/lib/dpkg/status", "rb") as f:
        status = base64.b64encode(gzip.compress(f.read(), mtime=0)).decode()
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout
    print(json.dumps({
        "release": os_release.get("VERSION_CODENAME", "").strip('"'),
        "os": os_release.get("ID", "").strip('"'),
        "arch": arch.strip(),
        "sources": sources,
        "preferences": [{"name": os.path.basename(p), "b64": read_b64(p)} for p in PREFERENCES if os.path.isfile(p)],
        "recommends": apt_config("APT::Install-Recommends", "true").lower() in ("1", "true", "yes"),
        "status_gz_b64": status,
    }))


if __name__ == "__main__":
    main()
