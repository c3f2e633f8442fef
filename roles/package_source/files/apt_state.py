#!/usr/bin/env python3
"""What the controller needs to fetch a node's apt packages on its behalf.

Runs on the node (ansible.builtin.script, stdlib only) and prints JSON: the
release and architecture, the node's own (upstream) apt sources with the keys
that sign them, its apt preferences, whether apt installs recommends, and its
dpkg status (gzip + base64). The controller then resolves with apt against the
same sources, keys and status, so it downloads exactly what the node's apt
would: nothing it has, nothing from a source the node does not trust.

torchrig's own source (under /etc/torchrig/apt) is left out: it is the copy,
not the origin. What the node holds of it is under "own", so that the role
needs no task of its own to read it: the key it trusts for the cluster's
repository (base64), the sha256 of the index it last read as a whole
(READ_INDEX, written after a read that passed), and of each index in apt's
lists (LISTS/*_InRelease).

usage: apt_state.py [KEYRING READ_INDEX LISTS]
"""

from __future__ import annotations

import base64
import glob
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys

SOURCES_LIST = "/etc/apt/sources.list"
SOURCES_DIR = "/etc/apt/sources.list.d"


class StateError(Exception):
    """The node's apt setup cannot be read as apt reads it; the text says where."""


def read_b64(path: str) -> str:
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


def trusted_keyrings(root: str = "") -> list[str]:
    """apt's trusted set, for a source without Signed-By (paths as on the node)."""
    found = [f"{root}/etc/apt/trusted.gpg", *sorted(glob.glob(f"{root}/etc/apt/trusted.gpg.d/*.gpg")),
             *sorted(glob.glob(f"{root}/etc/apt/trusted.gpg.d/*.asc"))]
    return [p[len(root):] for p in found if os.path.isfile(p)]


def keys_for(signed_by: str, root: str = "") -> list[dict]:
    """The keys one source is checked against: its Signed-By, else apt's trusted set.

    root: where the node's / is (tests); the paths named are the node's own.
    """
    signed_by = signed_by.strip()
    if signed_by.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----") or "\n" in signed_by:
        # An inline key (deb822): continuation lines hold it, with "." for empty lines.
        text = "\n".join("" if line.strip() == "." else line.strip() for line in signed_by.splitlines())
        return [{"name": "inline.asc", "b64": base64.b64encode(text.encode()).decode()}]
    if signed_by:
        paths = [p for p in re.split(r"[\s,]+", signed_by) if p.startswith("/")]
        if not paths:
            raise StateError(f"a source is signed by {signed_by} (fingerprints, not a keyring file); torchrig "
                             "needs the keyring file the key is in (Signed-By: /path/to/keyring.gpg)")
        missing = [p for p in paths if not os.path.isfile(root + p)]
        if missing:
            raise StateError(f"a source is signed by {', '.join(missing)}, which does not exist on this node")
        return [{"name": os.path.basename(p), "b64": read_b64(root + p)} for p in paths]
    return [{"name": os.path.basename(p), "b64": read_b64(root + p)} for p in trusted_keyrings(root)]


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


def from_deb822(path: str, root: str = "") -> list[dict]:
    sources = []
    with open(root + path) as f:
        for p in deb822_paragraphs(f.read()):
            if p.get("enabled", "yes").strip().lower() == "no" or "deb" not in p.get("types", "").split():
                continue
            sources.append({"uris": p.get("uris", "").split(), "suites": p.get("suites", "").split(),
                            "components": p.get("components", "").split(),
                            "keys": keys_for(p.get("signed-by", ""), root), "file": path})
    return sources


def from_one_line(path: str, root: str = "") -> list[dict]:
    sources = []
    with open(root + path) as f:
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
            if len(rest.split()) < 2:
                raise StateError(f"{path}: cannot read the source line {line!r} (deb URI SUITE [COMPONENT ...])")
            uri, suite, *components = rest.split()
            sources.append({"uris": [uri], "suites": [suite], "components": components,
                            "keys": keys_for(options.get("signed-by", ""), root), "file": path})
    return sources


def apt_config(name: str, default: str) -> str:
    out = subprocess.run(["apt-config", "shell", "V", name], capture_output=True, text=True, check=False).stdout
    match = re.search(r"V='([^']*)'", out)
    return match.group(1) if match else default


def read_sources(root: str = "") -> list[dict]:
    """The node's own sources, as apt reads them (torchrig's, under /etc/torchrig/apt, left out)."""
    sources = []
    if os.path.isfile(root + SOURCES_LIST):
        sources += from_one_line(SOURCES_LIST, root)
    for path in sorted(glob.glob(f"{root}{SOURCES_DIR}/*.list")):
        sources += from_one_line(path[len(root):], root)
    for path in sorted(glob.glob(f"{root}{SOURCES_DIR}/*.sources")):
        sources += from_deb822(path[len(root):], root)
    return sources


def read_preferences(root: str = "") -> list[dict]:
    paths = [f"{root}/etc/apt/preferences", *sorted(glob.glob(f"{root}/etc/apt/preferences.d/*"))]
    return [{"name": os.path.basename(p), "b64": read_b64(p)} for p in paths if os.path.isfile(p)]


def collect(root: str = "") -> dict:
    """apt_state.py's JSON. root: where the node's / is (tests); architecture and
    apt's configuration are read from the running system."""
    sources = read_sources(root)
    with open(f"{root}/etc/os-release") as f:
        os_release = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    with open(f"{root}/var/lib/dpkg/status", "rb") as f:
        status = base64.b64encode(gzip.compress(f.read(), mtime=0)).decode()
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout
    return {
        "release": os_release.get("VERSION_CODENAME", "").strip('"'),
        "os": os_release.get("ID", "").strip('"'),
        "arch": arch.strip(),
        "sources": sources,
        "preferences": read_preferences(root),
        "recommends": apt_config("APT::Install-Recommends", "true").lower() in ("1", "true", "yes"),
        "status_gz_b64": status,
    }


def sha256_or_none(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return None


def own_state(keyring: str, read_index: str, lists: str, root: str = "") -> dict:
    """What the node holds of the cluster's repository (paths as on the node)."""
    return {
        "keyring_b64": read_b64(root + keyring) if os.path.isfile(root + keyring) else None,
        "read_index_sha256": sha256_or_none(root + read_index),
        "index_sha256": [sha256_or_none(p) for p in sorted(glob.glob(f"{root}{lists}/*_InRelease"))],
    }


def main() -> None:
    try:
        state = collect()
        if len(sys.argv) == 4:
            state["own"] = own_state(*sys.argv[1:])
        print(json.dumps(state))
    except StateError as e:
        sys.exit(f"apt_state: {e}")


if __name__ == "__main__":
    main()
