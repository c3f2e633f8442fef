#!/usr/bin/env python3
"""The cluster's apt repository, filled on the controller (or the fetch host).

    apt_repo.py key --dir DIR
        The repository's signing key (made once, kept in DIR, never leaves
        it). Prints JSON: fingerprint, the public keyring's path, created.

    apt_repo.py fingerprints
        Reads a keyring (binary or armored), base64-encoded, on stdin. Prints
        JSON: the fingerprints of its primary keys.

    apt_repo.py fetch --states FILE --cache DIR --key-dir DIR --cluster NAME --sources JSON
                      [--no-recommends] PACKAGE ...
        FILE holds {host: apt_state.py's JSON}. JSON lists the sources the
        inventory declares ([{"uri": URI, "fingerprints": [FPR, ...]}]): of a
        node's own sources only those under a declared URI are used, with only
        the declared keys where fingerprints are given; any other source of
        the node is left out and reported (a node must not bring packages of
        its own into the repository every node trusts). For each node, apt
        resolves PACKAGE ... against those sources, the node's preferences and
        dpkg status (an apt root under DIR/clusters/NAME/roots, no chroot), and
        downloads what the node lacks. apt checks each upstream Release
        signature against the key the node trusts for that source, and each
        .deb against its Release's hashes. The .debs the node needs join
        DIR/clusters/NAME/repo/<os>-<release>-<arch>, a flat repository signed
        with torchrig's key; the nodes trust that key for it alone. Prints
        JSON: changed, added files, bytes, repositories, the sha256 of each
        one's InRelease, the key (as `key` prints it), and the node sources
        left out ("HOST: URI (FILE)").

Each .deb is downloaded once for the whole cluster, whatever the number of
nodes: the nodes then fetch from the cluster's package host.

One controller may serve several clusters, and several runs may fetch at the
same time. Each cluster (NAME) has its own apt roots and its own signed
repository, so one cluster's fetch never changes what another cluster's nodes
read; runs for the same cluster take turns (a lock in its directory). Only
the downloads are shared, in DIR/archives: a .deb is the same file whoever
asks for it, apt checks it against the asking node's signed index before it
is used, and runs take turns there too. The signing key is made under a lock.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import fnmatch
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

KEY_UID = "torchrig cluster packages"
# What apt prints when a source's signature cannot be trusted; it may still
# exit 0 (with older lists cached), so the output is read.
BAD_SIGNATURE = re.compile(
    r"NO_PUBKEY|EXPKEYSIG|BADSIG|is not signed|no longer signed|GPG error|"
    r"Conflicting values set for option Signed-By|The following signatures were invalid"
)
# Fixed: the Release file changes only when the packages do.
RELEASE_DATE = "Thu, 01 Jan 2026 00:00:00 UTC"
# A cluster's name becomes a directory name (the torchrig role checks torchrig_cluster_name
# by the job name rule; this is the path's own guard).
CLUSTER_NAME = re.compile(r"(?!\.)[\w.-]{1,64}", re.ASCII)
# The line apt-get --print-uris prints per .deb: 'URI' FILENAME SIZE HASH (the hash is
# MD5Sum or empty, whatever the index holds; apt checks the SHA256 itself when it downloads).
PRINTED_URI = re.compile(r"'(?P<uri>[^']+)' (?P<name>\S+) (?P<size>\d+) (?P<hash>\S*)")


class FetchError(Exception):
    """A failure the user must act on; its text says what and where."""


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on path (created) until the block ends; other runs wait their turn."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def gpg(home: Path, *args: str) -> bytes:
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--quiet", *args],
                          check=True, capture_output=True).stdout


def ensure_key(key_dir: Path) -> dict:
    """The signing key, created the first time; its public keyring beside it."""
    home, public = key_dir / "gnupg", key_dir / "torchrig-packages.gpg"
    created = False
    key_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(key_dir, 0o700)
    # Two first runs at once would each make a key, and one cluster would get the wrong public half.
    with locked(key_dir / ".lock"):
        if not public.is_file():
            home.mkdir(exist_ok=True)
            os.chmod(home, 0o700)
            gpg(home, "--passphrase", "", "--pinentry-mode", "loopback",
                "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
            tmp = public.with_suffix(".tmp")
            tmp.write_bytes(gpg(home, "--export", KEY_UID))
            tmp.rename(public)
            created = True
    listing = gpg(home, "--with-colons", "--list-keys", KEY_UID).decode()
    fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    return {"fingerprint": fingerprint, "public": str(public), "created": created}


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


class AptRoot:
    """apt's view of one kind of node (release, architecture, sources, keys), under a directory."""

    def __init__(self, base: Path, state: dict, archives: Path):
        self.state = state
        sources = json.dumps([state["sources"], state["preferences"]], sort_keys=True).encode()
        self.dir = base / f"{state['os']}-{state['release']}-{state['arch']}-{digest(sources)}"
        self.archives = archives

    def setup(self) -> None:
        d = self.dir
        # etc/apt.conf.d: apt reads Dir::Etc::parts and warns where it is missing.
        for sub in ("etc/sources.list.d", "etc/preferences.d", "etc/trusted.gpg.d", "etc/apt.conf.d", "keys",
                    "state/lists/partial", "cache", "no-archives/partial", "log", "status"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (self.archives / "partial").mkdir(parents=True, exist_ok=True)
        lines = []
        for i, source in enumerate(self.state["sources"]):
            keys = []
            for j, key in enumerate(source["keys"]):
                suffix = ".asc" if key["name"].endswith(".asc") else ".gpg"
                path = d / "keys" / f"{i}-{j}{suffix}"
                path.write_bytes(base64.b64decode(key["b64"]))
                keys.append(str(path))
            if not keys:
                raise FetchError(f"the source {' '.join(source['uris'])} ({source['file']}) has no key "
                                 "this node trusts; torchrig never fetches from an unsigned source")
            lines += ["Types: deb", f"URIs: {' '.join(source['uris'])}", f"Suites: {' '.join(source['suites'])}"]
            if source["components"]:
                lines.append(f"Components: {' '.join(source['components'])}")
            lines += [f"Signed-By: {' '.join(keys)}", ""]
        (d / "etc/sources.list.d/node.sources").write_text("\n".join(lines))
        for old in (d / "etc/preferences.d").iterdir():
            old.unlink()
        for pref in self.state["preferences"]:
            (d / "etc/preferences.d" / re.sub(r"[^\w.-]", "_", pref["name"], flags=re.ASCII)).write_bytes(
                base64.b64decode(pref["b64"]))
        (d / "apt.conf").write_text("\n".join([
            f'Dir "{d}/";',
            f'Dir::Etc "{d}/etc/";',
            'Dir::Etc::sourcelist "/dev/null";',
            f'Dir::Etc::sourceparts "{d}/etc/sources.list.d";',
            f'Dir::Etc::preferences "{d}/etc/preferences";',
            f'Dir::Etc::preferencesparts "{d}/etc/preferences.d";',
            f'Dir::Etc::trusted "{d}/etc/trusted.gpg";',
            f'Dir::Etc::trustedparts "{d}/etc/trusted.gpg.d";',
            f'Dir::State "{d}/state/";',
            f'Dir::Cache "{d}/cache/";',
            f'Dir::Cache::archives "{self.archives}/";',
            f'Dir::Log "{d}/log/";',
            f'APT::Architecture "{self.state["arch"]}";',
            f'APT::Architectures {{ "{self.state["arch"]}"; }};',
            'Acquire::Languages "none";',
            'Debug::NoLocking "true";',
            "",
        ]))

    def apt(self, *args: str, status: Path | None = None) -> subprocess.CompletedProcess:
        env = dict(os.environ, APT_CONFIG=str(self.dir / "apt.conf"), LC_ALL="C", DEBIAN_FRONTEND="noninteractive")
        extra = ["-o", f"Dir::State::status={status}"] if status else ["-o", "Dir::State::status=/dev/null"]
        return subprocess.run(["apt-get", *extra, *args], env=env, capture_output=True, text=True, check=False)

    def update(self) -> None:
        done = self.apt("update")
        bad = [line for line in (done.stdout + done.stderr).splitlines() if BAD_SIGNATURE.search(line)]
        if done.returncode != 0 or bad:
            raise FetchError(
                f"apt on the controller could not read the nodes' sources with the keys the nodes trust "
                f"({self.state['os']} {self.state['release']} {self.state['arch']}): "
                + " | ".join(bad or (done.stderr.strip().splitlines()[-3:])).rstrip(".")
                + ". Nothing was fetched or changed on the nodes.")

    def resolve_versions(self, packages: list[str], status: Path) -> list[str]:
        """NAME=VERSION* patterns (as the apt module takes them) as exact versions apt-get accepts."""
        out = []
        for spec in packages:
            name, _, version = spec.partition("=")
            if "*" not in version:
                out.append(spec)
                continue
            env = dict(os.environ, APT_CONFIG=str(self.dir / "apt.conf"), LC_ALL="C")
            madison = subprocess.run(["apt-cache", "-o", f"Dir::State::status={status}", "madison", name],
                                     env=env, capture_output=True, text=True, check=False).stdout
            versions = [line.split("|")[1].strip() for line in madison.splitlines() if line.count("|") >= 2]
            match = [v for v in versions if fnmatch.fnmatch(v, version)]
            if not match:
                raise FetchError(f"no version of {name} matches {version} in the nodes' sources "
                                 f"(found: {', '.join(versions) or 'none'})")
            out.append(f"{name}={match[0]}")  # madison lists the newest first
        return out

    def download(self, host: str, packages: list[str], recommends: bool) -> dict[str, int]:
        """Download what the node lacks into the shared archives (the caller holds their lock).

        Returns {file name in the archives: its size} for each .deb the node needs. apt checks
        each of them against the node's signed index (SHA256) in this download, so the caller
        takes them from the archives under the same lock.
        """
        status = self.dir / "status" / host
        status.write_bytes(gzip.decompress(base64.b64decode(self.state["status_gz_b64"])))
        exact = self.resolve_versions(packages, status)
        flags = ["--download-only", "--yes", "--allow-downgrades"]
        flags.append("--install-recommends" if recommends else "--no-install-recommends")
        # Against an empty archive directory apt lists every .deb the node needs, those
        # an earlier run (of any cluster) already downloaded into the shared one included.
        listed = self.apt("install", "--print-uris", "-o", f"Dir::Cache::archives={self.dir / 'no-archives'}/",
                          *flags, *exact, status=status)
        done = self.apt("install", *flags, *exact, status=status) if listed.returncode == 0 else listed
        if done.returncode != 0:
            raise FetchError(f"{host}: apt cannot install {' '.join(exact)} from the node's sources: "
                             + " | ".join(done.stderr.strip().splitlines()[-4:]).rstrip(".")
                             + ". Nothing was changed on the nodes.")
        matches = (PRINTED_URI.fullmatch(line) for line in listed.stdout.splitlines())
        return {m["name"]: int(m["size"]) for m in matches if m}


def control_fields(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout.rstrip("\n")


def write_repo(repo: Path, key_dir: Path, os_release_arch: str) -> None:
    """Packages, Packages.gz, Release and InRelease for the .debs under repo/pool."""
    stanzas = []
    for deb in sorted((repo / "pool").glob("*.deb")):
        data = deb.read_bytes()
        stanzas.append(control_fields(deb) + f"\nFilename: pool/{deb.name}\nSize: {len(data)}\n"
                       f"SHA256: {hashlib.sha256(data).hexdigest()}\n")
    packages = "\n".join(stanzas).encode()
    (repo / "Packages").write_bytes(packages)
    (repo / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    release = ["Origin: torchrig", f"Label: torchrig cluster packages ({os_release_arch})",
               f"Date: {RELEASE_DATE}", "SHA256:"]
    for name in ("Packages", "Packages.gz"):
        data = (repo / name).read_bytes()
        release.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    (repo / "Release").write_text("\n".join(release) + "\n")
    (repo / "InRelease").unlink(missing_ok=True)
    gpg(key_dir / "gnupg", "--local-user", KEY_UID, "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release"))


def indexed(repo: Path) -> set[str]:
    """The .deb files the repository's Packages index lists."""
    packages = repo / "Packages"
    text = packages.read_text() if packages.is_file() else ""
    return {line.split("/", 1)[1] for line in text.splitlines() if line.startswith("Filename: pool/")}


def pooled(repo: Path) -> set[str]:
    return {deb.name for deb in (repo / "pool").glob("*.deb")}


def signed_by(inrelease: Path, public: str) -> bool:
    """Whether the InRelease verifies with this public keyring (and no other key is needed)."""
    done = subprocess.run(["gpgv", "--keyring", public, str(inrelease)], capture_output=True, check=False)
    return done.returncode == 0


# What a node reports of itself names directories and goes into an apt.conf on the
# controller: only plain names pass (os-release's ID and VERSION_CODENAME, dpkg's arch).
NODE_NAME = re.compile(r"[a-z0-9][a-z0-9.+_-]{0,63}")


def check_state(host: str, state: dict) -> None:
    for field in ("os", "release", "arch"):
        value = state.get(field)
        if not isinstance(value, str) or not NODE_NAME.fullmatch(value):
            raise FetchError(f"{host} reported {field} {value!r}; expected a plain name such as debian, bookworm "
                             "or amd64 (lower-case letters, digits, '.', '+', '_', '-'). Nothing was fetched or "
                             "changed on the nodes.")


FINGERPRINT = re.compile(r"[0-9A-F]{40}|[0-9A-F]{64}")


def uri_parts(uri: str) -> tuple[str, int | None, tuple[str, ...]] | None:
    """(host, port or None for the scheme's own, path segments) of a plain http(s) URI, else None.

    http and https name the same archive (its signature, not the transport, is what is
    checked). Anything else (file:, a user, a query, '.' or '..', escapes) is no source
    a node may name: the controller's apt would read it.
    """
    try:
        p = urllib.parse.urlsplit(uri)
        port = p.port
    except ValueError:
        return None
    if p.scheme not in ("http", "https") or not p.hostname or p.username or p.password or p.query or p.fragment:
        return None
    if any(c in p.path for c in "%\\") or any(seg in (".", "..") for seg in p.path.split("/")):
        return None
    if port == {"http": 80, "https": 443}[p.scheme]:
        port = None
    return p.hostname.lower(), port, tuple(seg for seg in p.path.split("/") if seg)


def check_declared(declared: object) -> list[dict]:
    """The declared sources, checked: [{"uri": URI, "fingerprints": [FPR, ...]}] (fingerprints optional)."""
    if not isinstance(declared, list):
        raise FetchError(f"package_source_apt_sources must be a list of {{uri, fingerprints}}, not {declared!r}")
    out = []
    for entry in declared:
        uri = entry.get("uri") if isinstance(entry, dict) else None
        fprs = entry.get("fingerprints", []) if isinstance(entry, dict) else None
        if not isinstance(uri, str) or uri_parts(uri) is None or not isinstance(fprs, list) or not all(
                isinstance(f, str) and FINGERPRINT.fullmatch(f.replace(" ", "").upper()) for f in fprs):
            raise FetchError(f"package_source_apt_sources: {entry!r} is not {{uri: http(s)://HOST/PATH, "
                             "fingerprints: [40 or 64 hex digits, ...]}. Nothing was fetched.")
        out.append({"uri": uri, "parts": uri_parts(uri),
                    "fingerprints": sorted({f.replace(" ", "").upper() for f in fprs})})
    return out


def declared_for(uri: str, declared: list[dict]) -> dict | None:
    """The declared source a node's URI falls under (same host and port, its path below the declared one)."""
    parts = uri_parts(uri)
    if parts is None:
        return None
    for entry in declared:
        host, port, path = entry["parts"]
        if parts[:2] == (host, port) and parts[2][:len(path)] == path:
            return entry
    return None


def key_fingerprints(home: Path, data: bytes) -> list[str]:
    listing = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--with-colons", "--show-keys"],
                             input=data, capture_output=True, check=False).stdout.decode(errors="replace")
    prints, primary = [], False
    for line in listing.splitlines():
        kind = line.split(":")[0]
        if kind in ("pub", "sub"):
            primary = kind == "pub"
        elif kind == "fpr" and primary:
            prints.append(line.split(":")[9])
            primary = False
    return prints


def declared_keys(host: str, source: dict, uri: str, entry: dict) -> list[dict]:
    """The node's keys for this source, cut down to the declared fingerprints (all of them when none
    are declared). A node that lacks every declared key is refused by name."""
    if not entry["fingerprints"]:
        return source["keys"]
    with tempfile.TemporaryDirectory(prefix="torchrig-keys-") as tmp:
        home = Path(tmp) / "gnupg"
        home.mkdir(mode=0o700)
        try:
            found = []
            for key in source["keys"]:
                data = base64.b64decode(key["b64"])
                found += key_fingerprints(home, data)
                subprocess.run(["gpg", "--homedir", str(home), "--batch", "--quiet", "--import"], input=data,
                               capture_output=True, check=False)
            wanted = [f for f in entry["fingerprints"] if f in found]
            if not wanted:
                raise FetchError(
                    f"{host}: the source {uri} ({source['file']}) is declared with the key "
                    f"{', '.join(entry['fingerprints'])} (package_source_apt_sources), but the node's keys for it "
                    f"are {', '.join(found) or 'none'}. Nothing was fetched or changed on the nodes.")
            exported = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--export", *wanted],
                                      capture_output=True, check=True).stdout
        finally:
            subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True, check=False)
    return [{"name": "declared.gpg", "b64": base64.b64encode(exported).decode()}]


def declared_only(host: str, state: dict, declared: list[dict]) -> tuple[dict, list[str]]:
    """The node's state with its sources cut down to the declared ones, and what was left out."""
    kept, left_out = [], []
    for source in state["sources"]:
        for uri in source["uris"]:
            entry = declared_for(uri, declared)
            if entry is None:
                left_out.append(f"{host}: {uri} ({source['file']})")
                continue
            kept.append({**source, "uris": [uri], "keys": declared_keys(host, source, uri, entry)})
    return {**state, "sources": kept}, left_out


def fetch(states: dict, packages: list[str], cache: Path, key_dir: Path, recommends: bool, cluster: str,
          declared: object) -> dict:
    if not CLUSTER_NAME.fullmatch(cluster):
        raise FetchError(f"the cluster's name {cluster!r} must be 1 to 64 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit (torchrig_cluster_name). Nothing was fetched.")
    for host, state in states.items():
        check_state(host, state)
    sources = check_declared(declared)
    ignored: list[str] = []
    for host in sorted(states):
        states[host], left_out = declared_only(host, states[host], sources)
        ignored += left_out
    # Absolute: apt reads the paths of its root relative to Dir, not to the working directory.
    cache, key_dir = cache.absolute(), key_dir.absolute()
    home = cache / "clusters" / cluster
    key = ensure_key(key_dir)
    with locked(home / ".lock"):
        roots: dict[Path, AptRoot] = {}
        new_debs: dict[str, dict[str, int]] = {}
        for host, state in sorted(states.items()):
            root = AptRoot(home / "roots", state, cache / "archives")
            if root.dir not in roots:
                root.setup()
                root.update()
                roots[root.dir] = root
            roots[root.dir].state = state
            name = f"{state['os']}-{state['release']}-{state['arch']}"
            with locked(cache / "archives.lock"):
                try:
                    wanted = roots[root.dir].download(host, packages, recommends and state["recommends"])
                except FetchError as e:
                    mine = [i for i in ignored if i.startswith(f"{host}: ")]
                    if not mine:
                        raise
                    raise FetchError(f"{e} The node's sources not declared in package_source_apt_sources "
                                     f"were left out: {'; '.join(mine)}.") from e
                new_debs.setdefault(name, {}).update(
                    link_into_pool(cache / "archives", home / "repo" / name / "pool", wanted))
        added, size, repos, inrelease, resigned = [], 0, {}, {}, False
        for name in sorted({f"{s['os']}-{s['release']}-{s['arch']}" for s in states.values()}):
            repo = home / "repo" / name
            (repo / "pool").mkdir(parents=True, exist_ok=True)
            new = new_debs.get(name, {})
            added += [f"{name}/{deb}" for deb in sorted(new)]
            size += sum(new.values())
            # A new key (the key directory was lost) re-signs the index: the nodes get its public half.
            stale = (repo / "InRelease").exists() and not signed_by(repo / "InRelease", key["public"])
            # An index that misses a pool file: a run stopped between the two.
            if new or stale or not (repo / "InRelease").exists() or indexed(repo) != pooled(repo):
                write_repo(repo, key_dir, name)
            resigned = resigned or stale
            repos[name] = str(repo)
            inrelease[name] = hashlib.sha256((repo / "InRelease").read_bytes()).hexdigest()
    return {"changed": bool(added) or resigned or key["created"], "added": added, "bytes": size, "repos": repos,
            "inrelease": inrelease, "key": key, "ignored": ignored}


def link_into_pool(archives: Path, pool: Path, wanted: dict[str, int]) -> dict[str, int]:
    """Put the wanted .debs the pool lacks into it; returns {file name: size} of those added.

    A hard link where it can (the pool then costs no space; apt replaces an archive file by
    renaming a new one over it, so a linked pool file never changes), else a copy.
    """
    pool.mkdir(parents=True, exist_ok=True)
    added = {}
    for name, size in sorted(wanted.items()):
        src, dest = archives / name, pool / name
        if dest.exists():
            continue
        if not src.is_file() or src.stat().st_size != size:
            raise FetchError(f"apt downloaded {name}, but the file in {archives} is not the one the node's "
                             "signed index names. Nothing was changed on the nodes; run again.")
        tmp = pool / f".{name}.tmp"
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copy2(src, tmp)
        tmp.rename(dest)
        added[name] = dest.stat().st_size
    return added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    key = sub.add_parser("key")
    key.add_argument("--dir", type=Path, required=True)
    sub.add_parser("fingerprints")
    get = sub.add_parser("fetch")
    get.add_argument("--states", type=Path, required=True)
    get.add_argument("--cache", type=Path, required=True)
    get.add_argument("--key-dir", type=Path, required=True)
    get.add_argument("--cluster", required=True, help="the cluster's name: its own apt roots and repository")
    get.add_argument("--sources", required=True,
                     help="JSON: the declared sources, [{uri, fingerprints}]; a node's other sources are left out")
    get.add_argument("--no-recommends", action="store_true")
    get.add_argument("packages", nargs="+")
    args = parser.parse_args()
    if args.command == "fingerprints":
        with tempfile.TemporaryDirectory(prefix="torchrig-keys-") as tmp:
            home = Path(tmp) / "gnupg"
            home.mkdir(mode=0o700)
            print(json.dumps(key_fingerprints(home, base64.b64decode(sys.stdin.read()))))
        return
    key_dir = (args.dir if args.command == "key" else args.key_dir).absolute()
    try:
        if args.command == "key":
            print(json.dumps(ensure_key(key_dir)))
        else:
            states = json.loads(args.states.read_text())
            try:
                declared = json.loads(args.sources)
            except ValueError as e:
                raise FetchError(f"--sources is not JSON ({e}). Nothing was fetched.") from e
            print(json.dumps(fetch(states, args.packages, args.cache, key_dir, not args.no_recommends,
                                   args.cluster, declared)))
    except FetchError as e:
        sys.exit(str(e))
    finally:
        # gpg started an agent for the key's home: it would stay, one per run's key directory.
        if (key_dir / "gnupg").is_dir():
            subprocess.run(["gpgconf", "--homedir", str(key_dir / "gnupg"), "--kill", "gpg-agent"],
                           capture_output=True, check=False)


if __name__ == "__main__":
    main()
