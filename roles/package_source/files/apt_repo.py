#!/usr/bin/env python3
"""The cluster's apt repository, filled on the controller (or the fetch host).

    apt_repo.py key --dir DIR
        The repository's signing key (made once, kept in DIR, never leaves
        it). Prints JSON: fingerprint, the public keyring's path, created.

    apt_repo.py fetch --states FILE --cache DIR --key-dir DIR [--no-recommends] PACKAGE ...
        FILE holds {host: apt_state.py's JSON}. For each node, apt resolves
        PACKAGE ... against the node's own sources, keys, preferences and dpkg
        status (an apt root under DIR/roots, no chroot), and downloads what
        the node lacks. apt checks each upstream Release signature against the
        key the node trusts for that source, and each .deb against its
        Release's hashes. The new .debs join DIR/repo/<os>-<release>-<arch>, a
        flat repository signed with torchrig's key; the nodes trust that key
        for it alone. Prints JSON: changed, added files, bytes, repositories,
        the sha256 of each one's InRelease, and the key (as `key` prints it).

Each .deb is downloaded once for the whole cluster, whatever the number of
nodes: the nodes then fetch from the cluster's package host.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
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


class FetchError(Exception):
    """A failure the user must act on; its text says what and where."""


def gpg(home: Path, *args: str) -> bytes:
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--quiet", *args],
                          check=True, capture_output=True).stdout


def ensure_key(key_dir: Path) -> dict:
    """The signing key, created the first time; its public keyring beside it."""
    home, public = key_dir / "gnupg", key_dir / "torchrig-packages.gpg"
    created = False
    if not public.is_file():
        home.mkdir(parents=True, exist_ok=True)
        os.chmod(key_dir, 0o700)
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

    def __init__(self, base: Path, state: dict):
        self.state = state
        sources = json.dumps([state["sources"], state["preferences"]], sort_keys=True).encode()
        self.dir = base / f"{state['os']}-{state['release']}-{state['arch']}-{digest(sources)}"
        self.archives = self.dir / "archives"

    def setup(self) -> None:
        d = self.dir
        # etc/apt.conf.d: apt reads Dir::Etc::parts and warns where it is missing.
        for sub in ("etc/sources.list.d", "etc/preferences.d", "etc/trusted.gpg.d", "etc/apt.conf.d", "keys",
                    "state/lists/partial", "cache", "archives/partial", "log", "status"):
            (d / sub).mkdir(parents=True, exist_ok=True)
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

    def download(self, host: str, packages: list[str], recommends: bool) -> None:
        status = self.dir / "status" / host
        status.write_bytes(gzip.decompress(base64.b64decode(self.state["status_gz_b64"])))
        exact = self.resolve_versions(packages, status)
        flags = ["--download-only", "--yes", "--allow-downgrades"]
        flags.append("--install-recommends" if recommends else "--no-install-recommends")
        done = self.apt("install", *flags, *exact, status=status)
        if done.returncode != 0:
            raise FetchError(f"{host}: apt cannot install {' '.join(exact)} from the node's sources: "
                             + " | ".join(done.stderr.strip().splitlines()[-4:]).rstrip(".")
                             + ". Nothing was changed on the nodes.")


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


def signed_by(inrelease: Path, public: str) -> bool:
    """Whether the InRelease verifies with this public keyring (and no other key is needed)."""
    done = subprocess.run(["gpgv", "--keyring", public, str(inrelease)], capture_output=True, check=False)
    return done.returncode == 0


def fetch(states: dict, packages: list[str], cache: Path, key_dir: Path, recommends: bool) -> dict:
    # Absolute: apt reads the paths of its root relative to Dir, not to the working directory.
    cache, key_dir = cache.absolute(), key_dir.absolute()
    key = ensure_key(key_dir)
    roots: dict[Path, AptRoot] = {}
    for host, state in sorted(states.items()):
        root = AptRoot(cache / "roots", state)
        if root.dir not in roots:
            root.setup()
            root.update()
            roots[root.dir] = root
        roots[root.dir].state = state
        roots[root.dir].download(host, packages, recommends and state["recommends"])
    added, size, repos, inrelease, resigned = [], 0, {}, {}, False
    for root in roots.values():
        name = f"{root.state['os']}-{root.state['release']}-{root.state['arch']}"
        repo = cache / "repo" / name
        (repo / "pool").mkdir(parents=True, exist_ok=True)
        new = [deb for deb in sorted(root.archives.glob("*.deb")) if not (repo / "pool" / deb.name).exists()]
        for deb in new:
            shutil.copy2(deb, repo / "pool" / deb.name)
            added.append(f"{name}/{deb.name}")
            size += deb.stat().st_size
        # A new key (the key directory was lost) re-signs the index: the nodes get its public half.
        stale = (repo / "InRelease").exists() and not signed_by(repo / "InRelease", key["public"])
        if new or stale or not (repo / "InRelease").exists():
            write_repo(repo, key_dir, name)
        resigned = resigned or stale
        repos[name] = str(repo)
        inrelease[name] = hashlib.sha256((repo / "InRelease").read_bytes()).hexdigest()
    return {"changed": bool(added) or resigned or key["created"], "added": added, "bytes": size, "repos": repos,
            "inrelease": inrelease, "key": key}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    key = sub.add_parser("key")
    key.add_argument("--dir", type=Path, required=True)
    get = sub.add_parser("fetch")
    get.add_argument("--states", type=Path, required=True)
    get.add_argument("--cache", type=Path, required=True)
    get.add_argument("--key-dir", type=Path, required=True)
    get.add_argument("--no-recommends", action="store_true")
    get.add_argument("packages", nargs="+")
    args = parser.parse_args()
    key_dir = (args.dir if args.command == "key" else args.key_dir).absolute()
    try:
        if args.command == "key":
            print(json.dumps(ensure_key(key_dir)))
        else:
            states = json.loads(args.states.read_text())
            print(json.dumps(fetch(states, args.packages, args.cache, key_dir, not args.no_recommends)))
    except FetchError as e:
        sys.exit(str(e))
    finally:
        # gpg started an agent for the key's home: it would stay, one per run's key directory.
        if (key_dir / "gnupg").is_dir():
            subprocess.run(["gpgconf", "--homedir", str(key_dir / "gnupg"), "--kill", "gpg-agent"],
                           capture_output=True, check=False)


if __name__ == "__main__":
    main()
