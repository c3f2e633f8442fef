"""The package_source role's apt side, with real apt, gpg and HTTP: apt_state.py
(the node's sources and keys) and apt_repo.py fetch (the cluster's repository)
against the stand-in NVIDIA repository (tests/fixtures/nvidia_repo/build.py),
served by `python3 -m http.server` on 127.0.0.1, then read back the way a node
reads it. Private apt roots only: nothing is installed on this machine."""

import base64
import contextlib
import gzip
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from rolepy import ROOT, load

st = load("roles/package_source/files/apt_state.py", "torchrig_apt_state")
APT_REPO = ROOT / "roles/package_source/files/apt_repo.py"
REPO_NAME = "debian-bookworm-amd64"
CLUSTER = "c1"
TOOLS = ("apt-get", "apt-cache", "dpkg-deb", "gpg", "gpgv", "gpgconf")
pytestmark = pytest.mark.skipif(not all(shutil.which(t) for t in TOOLS), reason=f"needs {', '.join(TOOLS)}")
DKMS = (
    "Package: dkms\nStatus: install ok installed\nVersion: 3.0.10-8\nArchitecture: all\nMaintainer: x\nDescription: x\n"
)


# --- apt_state.py: the node's sources, as functions over a directory standing for its / ---


def write(root, path, text):
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(text if isinstance(text, bytes) else text.encode())
    return target


def b64(data):
    return base64.b64encode(data).decode()


def test_deb822_signed_by_path(tmp_path):
    write(tmp_path, "/usr/share/keyrings/vendor.gpg", b"\x99binary keyring")
    write(
        tmp_path,
        "/etc/apt/sources.list.d/vendor.sources",
        "# a comment\nTypes: deb deb-src\nURIs: http://a.invalid/debian http://b.invalid/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main contrib\n"
        "Signed-By: /usr/share/keyrings/vendor.gpg\n",
    )
    assert st.read_sources(str(tmp_path)) == [
        {
            "uris": ["http://a.invalid/debian", "http://b.invalid/debian"],
            "suites": ["bookworm", "bookworm-updates"],
            "components": ["main", "contrib"],
            "keys": [{"name": "vendor.gpg", "b64": b64(b"\x99binary keyring")}],
            "file": "/etc/apt/sources.list.d/vendor.sources",
        }
    ]


def test_deb822_inline_key(tmp_path, built):
    """An inline Signed-By block ("." for its empty lines) comes back as the armored key itself."""
    armored = armor(tmp_path, built["keyring"]).decode()
    block = "\n".join(" " + (line or ".") for line in armored.strip().splitlines())
    sources = f"Types: deb\nURIs: http://x.invalid/\nSuites: /\nSigned-By:\n{block}\n"
    write(tmp_path, "/etc/apt/sources.list.d/cuda.sources", sources)
    (source,) = st.read_sources(str(tmp_path))
    assert source["components"] == [] and source["suites"] == ["/"]
    (key,) = source["keys"]
    assert key["name"] == "inline.asc"
    text = base64.b64decode(key["b64"])
    assert text.strip() == armored.strip().encode()
    assert fingerprints(text, tmp_path) == [built["good"]]


def test_deb822_disabled_and_deb_src_left_out(tmp_path):
    write(tmp_path, "/k.gpg", b"k")
    write(
        tmp_path,
        "/etc/apt/sources.list.d/mixed.sources",
        "Types: deb\nURIs: http://off.invalid/\nSuites: /\nEnabled: no\nSigned-By: /missing.gpg\n\n"
        "Types: deb-src\nURIs: http://src.invalid/\nSuites: /\nSigned-By: /k.gpg\n\n"
        "Types: deb\nURIs: http://on.invalid/\nSuites: /\nEnabled: yes\nSigned-By: /k.gpg\n",
    )
    assert [s["uris"] for s in st.read_sources(str(tmp_path))] == [["http://on.invalid/"]]


def test_one_line_signed_by(tmp_path):
    write(tmp_path, "/usr/share/keyrings/cuda-archive-keyring.gpg", b"cuda")
    write(
        tmp_path,
        "/etc/apt/sources.list",
        "# deb http://commented.invalid/ bookworm main\n"
        "deb-src [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] http://src.invalid/ bookworm main\n"
        "deb [arch=amd64 signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] http://a.invalid/debian bookworm"
        " main non-free  # trailing comment\n"
        "deb [ signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg ] http://flat.invalid/repo/ /\n",
    )
    key = [{"name": "cuda-archive-keyring.gpg", "b64": b64(b"cuda")}]
    assert st.read_sources(str(tmp_path)) == [
        {
            "uris": ["http://a.invalid/debian"],
            "suites": ["bookworm"],
            "components": ["main", "non-free"],
            "keys": key,
            "file": "/etc/apt/sources.list",
        },
        {
            "uris": ["http://flat.invalid/repo/"],
            "suites": ["/"],
            "components": [],
            "keys": key,
            "file": "/etc/apt/sources.list",
        },
    ]


def test_no_signed_by_falls_back_to_trusted_set(tmp_path):
    write(tmp_path, "/etc/apt/trusted.gpg", b"legacy")
    write(tmp_path, "/etc/apt/trusted.gpg.d/debian.gpg", b"debian")
    write(tmp_path, "/etc/apt/trusted.gpg.d/local.asc", b"armored")
    write(tmp_path, "/etc/apt/trusted.gpg.d/README", b"not a key")
    write(tmp_path, "/etc/apt/sources.list.d/debian.list", "deb http://deb.debian.org/debian bookworm main\n")
    write(tmp_path, "/etc/apt/sources.list.d/other.sources", "Types: deb\nURIs: http://o.invalid/\nSuites: /\n")
    sources = st.read_sources(str(tmp_path))
    assert [s["file"] for s in sources] == [
        "/etc/apt/sources.list.d/debian.list",
        "/etc/apt/sources.list.d/other.sources",
    ]
    for source in sources:
        assert [(k["name"], base64.b64decode(k["b64"])) for k in source["keys"]] == [
            ("trusted.gpg", b"legacy"),
            ("debian.gpg", b"debian"),
            ("local.asc", b"armored"),
        ]


@pytest.mark.parametrize(
    "path,text",
    [
        (
            "/etc/apt/sources.list.d/gone.sources",
            "Types: deb\nURIs: http://x.invalid/\nSuites: /\nSigned-By: /usr/share/keyrings/gone.gpg\n",
        ),
        ("/etc/apt/sources.list.d/gone.list", "deb [signed-by=/usr/share/keyrings/gone.gpg] http://x.invalid/ /\n"),
    ],
)
def test_signed_by_missing_file_names_it(tmp_path, path, text):
    write(tmp_path, path, text)
    with pytest.raises(st.StateError, match="/usr/share/keyrings/gone.gpg, which does not exist on this node"):
        st.read_sources(str(tmp_path))


def test_signed_by_fingerprint_is_refused_clearly(tmp_path):
    write(
        tmp_path,
        "/etc/apt/sources.list.d/fpr.sources",
        "Types: deb\nURIs: http://x.invalid/\nSuites: /\nSigned-By: 0CFECE6DD2D9D64F03BEC9367166125621695B1D\n",
    )
    with pytest.raises(st.StateError, match="0CFECE6DD2D9D64F03BEC9367166125621695B1D.*keyring file"):
        st.read_sources(str(tmp_path))


def test_own_state_names_the_trusted_key_the_index_last_read_and_the_lists(tmp_path):
    """What the node holds of the cluster's repository, read in the same call as its sources."""
    keyring, read, lists = "/etc/apt/keyrings/torchrig-packages.gpg", "/etc/torchrig/apt/read.InRelease", "/lists"
    assert st.own_state(keyring, read, lists, str(tmp_path)) == {
        "keyring_b64": None, "read_index_sha256": None, "index_sha256": []}
    write(tmp_path, keyring, b"\x99key")
    write(tmp_path, read, "signed index\n")
    write(tmp_path, "/lists/10.0.0.11:8081_apt_debian-bookworm-amd64_InRelease", "signed index\n")
    write(tmp_path, "/lists/10.0.0.11:8081_apt_debian-bookworm-amd64_Packages", "Package: x\n")
    sha = hashlib.sha256(b"signed index\n").hexdigest()
    assert st.own_state(keyring, read, lists, str(tmp_path)) == {
        "keyring_b64": b64(b"\x99key"), "read_index_sha256": sha, "index_sha256": [sha]}


def test_cli_turns_a_state_error_into_its_message(monkeypatch):
    def broken():
        raise st.StateError("a source is signed by /x.gpg, which does not exist on this node")

    monkeypatch.setattr(st, "collect", broken)
    with pytest.raises(SystemExit, match="^apt_state: a source is signed by /x.gpg"):
        st.main()


def test_collect_reads_a_node_with_cuda_keyring(built):
    """The node fixture (cuda-keyring unpacked, dkms installed) read as the node's apt would read it."""
    state = st.collect(str(built["node_root"]))
    assert (state["os"], state["release"]) == ("debian", "bookworm")
    assert state["preferences"] == [] and isinstance(state["recommends"], bool)
    (source,) = state["sources"]
    assert source == {
        "uris": [built["url"]],
        "suites": ["/"],
        "components": [],
        "keys": [{"name": "cuda-archive-keyring.gpg", "b64": b64(built["keyring"].read_bytes())}],
        "file": "/etc/apt/sources.list.d/cuda-debian12-x86_64.list",
    }
    assert gzip.decompress(base64.b64decode(state["status_gz_b64"])).decode() == DKMS


# --- helpers: keys, the HTTP server, apt_repo.py ---


@contextlib.contextmanager
def gpg_home(tmp_path):
    """A throwaway gpg home; the agent gpg may start in it is stopped after."""
    home = tmp_path / "gnupg-test"
    home.mkdir(mode=0o700, exist_ok=True)
    try:
        yield home
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True, check=False)


def armor(tmp_path, keyring):
    with gpg_home(tmp_path) as home:
        gpg = ["gpg", "--homedir", str(home), "--batch", "--quiet"]
        subprocess.run([*gpg, "--import", str(keyring)], check=True, capture_output=True)
        return subprocess.run([*gpg, "--armor", "--export"], check=True, capture_output=True).stdout


def fingerprints(key_bytes, tmp_path):
    with gpg_home(tmp_path) as home:
        out = subprocess.run(
            ["gpg", "--homedir", str(home), "--batch", "--with-colons", "--show-keys"],
            input=key_bytes,
            check=True,
            capture_output=True,
        ).stdout.decode()
    return [line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:")][:1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """python3 -m http.server over a directory; tests publish repositories under it."""
    www = tmp_path_factory.mktemp("www")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(www), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("python3 -m http.server did not start")
            time.sleep(0.05)
    DECLARED[:] = [{"uri": f"http://127.0.0.1:{port}/"}]
    yield {"www": www, "url": f"http://127.0.0.1:{port}"}
    proc.terminate()
    proc.wait(timeout=10)


def publish(server, name, directory):
    """Serve directory at URL/name/ (a link under the server's root)."""
    link = server["www"] / name
    if link.is_symlink():
        link.unlink()
    link.symlink_to(directory)
    return f"{server['url']}/{name}/"


@pytest.fixture(scope="module")
def built(server, tmp_path_factory):
    """The stand-in NVIDIA repository at URL/nvidia/ (plus a copy served with the wrong key and an
    unsigned one), and a node root with its cuda-keyring unpacked and dkms installed."""
    out = tmp_path_factory.mktemp("standin")
    url = f"{server['url']}/nvidia/"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests/fixtures/nvidia_repo/build.py"),
            str(ROOT / "roles/preflight/files/compat_matrix.yml"),
            str(out),
            url,
        ],
        check=True,
        capture_output=True,
    )
    publish(server, "nvidia", out / "repo")
    wrong = shutil.copytree(out / "repo", out / "wrongkey")
    shutil.copy(out / "keys/InRelease.wrongkey", wrong / "InRelease")
    (wrong / "Release.gpg").unlink()
    unsigned = shutil.copytree(out / "repo", out / "unsigned")
    (unsigned / "InRelease").unlink()
    (unsigned / "Release.gpg").unlink()
    node = out / "node"
    subprocess.run(["dpkg-deb", "-x", str(out / "repo/cuda-keyring_1.1-1_all.deb"), str(node)], check=True)
    write(node, "/etc/os-release", 'ID=debian\nVERSION_CODENAME=bookworm\nPRETTY_NAME="Debian GNU/Linux 12"\n')
    write(node, "/var/lib/dpkg/status", DKMS)
    return {
        "out": out,
        "url": url,
        "repo": out / "repo",
        "node_root": node,
        "keyring": node / "usr/share/keyrings/cuda-archive-keyring.gpg",
        "good": (out / "keys/good.fpr").read_text().strip(),
        "wrong_url": publish(server, "wrongkey", wrong),
        "unsigned_url": publish(server, "unsigned", unsigned),
    }


def stanzas(text):
    return [
        dict(line.split(": ", 1) for line in s.splitlines() if ": " in line and not line.startswith(" "))
        for s in text.strip().split("\n\n")
        if s.strip()
    ]


def standin_versions(built, name):
    return [s["Version"] for s in stanzas((built["repo"] / "Packages").read_text()) if s["Package"] == name]


def status_entry(built, name, version):
    """The package's stanza from the stand-in's Packages, as dpkg records an installed package."""
    for stanza in (built["repo"] / "Packages").read_text().split("\n\n"):
        if f"Package: {name}\n" in stanza and f"Version: {version}\n" in stanza:
            keep = [ln for ln in stanza.splitlines() if not ln.startswith(("Filename", "Size", "MD5sum", "SHA256"))]
            keep.insert(1, "Status: install ok installed")
            return "\n".join(keep) + "\n"
    raise AssertionError(f"{name} {version} is not in the stand-in")


@pytest.fixture(scope="module")
def node_state(built):
    """apt_state.py's JSON for the node (arch amd64, as the stand-in's packages)."""
    return {**st.collect(str(built["node_root"])), "arch": "amd64"}


def with_uri(state, uri, status=None):
    state = json.loads(json.dumps(state))
    state["sources"][0]["uris"] = [uri]
    if status is not None:
        state["status_gz_b64"] = b64(gzip.compress(status.encode()))
    return state


def repo_of(tmp, cluster=CLUSTER):
    """Where fetch keeps a cluster's repository for the nodes' kind (Debian 12, amd64)."""
    return tmp / "cache/clusters" / cluster / "repo" / REPO_NAME


# The sources the tests declare by default: everything the test server serves.
DECLARED = []


def fetch_argv(tmp, *packages, cache=None, key_dir=None, cluster=CLUSTER, sources=None):
    cache, key_dir = cache or tmp / "cache", key_dir or tmp / "key"
    return [sys.executable, str(APT_REPO), "fetch", "--states", "/dev/stdin", "--cache", str(cache),
            "--key-dir", str(key_dir), f"--cluster={cluster}", "--sources", json.dumps(sources or DECLARED),
            *packages]


def fetch(tmp, states, *packages, cache=None, key_dir=None, cwd=None, cluster=CLUSTER, sources=None):
    """apt_repo.py fetch, as the role runs it (the states on stdin)."""
    done = subprocess.run(
        fetch_argv(tmp, *packages, cache=cache, key_dir=key_dir, cluster=cluster, sources=sources),
        input=json.dumps(states),
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        timeout=120,
    )
    return done


def verifies(inrelease, keyring):
    return (
        subprocess.run(["gpgv", "--keyring", str(keyring), str(inrelease)], capture_output=True, check=False).returncode
        == 0
    )


# --- apt_repo.py fetch against the stand-in ---


@pytest.fixture(scope="module")
def driver(built):
    """The oldest nvidia-open the stand-in holds for Debian 12, as NAME=VERSION*."""
    versions = standin_versions(built, "nvidia-open")
    oldest = min(versions, key=lambda v: [int(x) for x in v.split("-")[0].split(".")])
    assert len(versions) > 1
    return {"version": oldest, "pattern": f"nvidia-open={oldest.split('-')[0]}*"}


@pytest.fixture(scope="module")
def cluster(built, node_state, driver, tmp_path_factory):
    """One fetch of the driver for two nodes of the same kind: the cluster's repository."""
    tmp = tmp_path_factory.mktemp("cluster")
    done = fetch(tmp, {"node1": node_state, "node2": node_state}, driver["pattern"])
    assert done.returncode == 0, done.stderr
    repo = repo_of(tmp)
    yield {"tmp": tmp, "out": json.loads(done.stdout), "repo": repo, "public": tmp / "key/torchrig-packages.gpg"}
    subprocess.run(["gpgconf", "--homedir", str(tmp / "key/gnupg"), "--kill", "all"], capture_output=True, check=False)


def test_fetch_downloads_the_driver_and_its_dependencies(built, cluster, driver):
    pool = cluster["repo"] / "pool"
    names = sorted(p.name for p in pool.iterdir())
    # The pattern's version of nvidia-open; its dependencies at the newest the stand-in holds
    # (">=" dependencies); dkms is installed on the node, so it is not fetched.
    assert f"nvidia-open_{driver['version']}_amd64.deb" in names
    assert sorted(n.split("_")[0] for n in names) == [
        "nvidia-kernel-open-dkms",
        "nvidia-open",
        "nvidia-persistenced",
        "nvidia-smi",
    ]
    for name in names:
        assert (pool / name).read_bytes() == (built["repo"] / name).read_bytes(), name
    out = cluster["out"]
    assert out["changed"] is True
    assert out["added"] == [f"{REPO_NAME}/{n}" for n in names]
    assert out["bytes"] == sum((pool / n).stat().st_size for n in names)
    assert out["repos"] == {REPO_NAME: str(cluster["repo"])}
    assert out["inrelease"] == {REPO_NAME: hashlib.sha256((cluster["repo"] / "InRelease").read_bytes()).hexdigest()}
    # The key it made for the repository, whose public half the role gives the nodes.
    assert out["key"]["created"] is True and out["key"]["public"] == str(cluster["public"])
    assert fingerprints(cluster["public"].read_bytes(), cluster["tmp"]) == [out["key"]["fingerprint"]]


def test_cluster_repository_is_signed_by_torchrig_only(built, cluster, tmp_path):
    inrelease = cluster["repo"] / "InRelease"
    assert verifies(inrelease, cluster["public"])
    assert not verifies(inrelease, built["keyring"])
    assert fingerprints(cluster["public"].read_bytes(), tmp_path) != [built["good"]]
    key_dir = cluster["tmp"] / "key"
    assert (key_dir.stat().st_mode & 0o777) == 0o700 and ((key_dir / "gnupg").stat().st_mode & 0o777) == 0o700


def test_cluster_index_lists_exactly_the_pool(cluster):
    repo = cluster["repo"]
    packages = (repo / "Packages").read_bytes()
    assert gzip.decompress((repo / "Packages.gz").read_bytes()) == packages
    entries = stanzas(packages.decode())
    assert sorted(e["Filename"] for e in entries) == sorted(f"pool/{p.name}" for p in (repo / "pool").iterdir())
    for e in entries:
        data = (repo / e["Filename"]).read_bytes()
        assert e["SHA256"] == hashlib.sha256(data).hexdigest() and int(e["Size"]) == len(data)
        assert e["Filename"] == f"pool/{e['Package']}_{e['Version']}_{e['Architecture']}.deb"
    release = (repo / "Release").read_text()
    for name in ("Packages", "Packages.gz"):
        data = (repo / name).read_bytes()
        assert f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}\n" in release
    assert release in (repo / "InRelease").read_text()


def test_second_fetch_changes_nothing(cluster, node_state, driver):
    before = (cluster["repo"] / "InRelease").read_bytes()
    done = fetch(cluster["tmp"], {"node1": node_state, "node2": node_state}, driver["pattern"])
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["changed"], out["added"], out["bytes"]) == (False, [], 0)
    assert (cluster["repo"] / "InRelease").read_bytes() == before
    assert out["inrelease"] == cluster["out"]["inrelease"]
    assert out["key"] == {**cluster["out"]["key"], "created": False}


@pytest.mark.parametrize("kind,message", [("wrong_url", "NO_PUBKEY"), ("unsigned_url", "is not signed")])
def test_fetch_refuses_a_source_the_node_cannot_verify(built, node_state, tmp_path, kind, message):
    done = fetch(tmp_path, {"node1": with_uri(node_state, built[kind])}, "nvidia-smi")
    assert done.returncode != 0
    assert message in done.stderr and "Nothing was fetched" in done.stderr, done.stderr
    assert not (tmp_path / "cache/clusters" / CLUSTER / "repo").exists()


def test_fetch_refuses_a_source_whose_signature_goes_bad_after_a_good_read(built, server, node_state, tmp_path):
    """apt keeps the lists it read before (and may exit 0): the output is what tells."""
    flip = shutil.copytree(built["repo"], tmp_path / "flip")
    state = {"node1": with_uri(node_state, publish(server, "flip", flip))}
    assert fetch(tmp_path, state, "nvidia-smi").returncode == 0
    shutil.copy(built["out"] / "keys/InRelease.wrongkey", flip / "InRelease")
    (flip / "Release.gpg").unlink()
    done = fetch(tmp_path, state, "nvidia-persistenced")
    assert done.returncode != 0
    assert "NO_PUBKEY" in done.stderr and "Nothing was fetched" in done.stderr, done.stderr
    pool = repo_of(tmp_path) / "pool"
    assert not any(p.name.startswith("nvidia-persistenced") for p in pool.iterdir())


def test_fetch_names_a_package_that_does_not_exist(node_state, tmp_path):
    done = fetch(tmp_path, {"node1": node_state}, "nvidia-smi", "torchrig-no-such-package")
    assert done.returncode != 0
    assert "torchrig-no-such-package" in done.stderr and "Nothing was changed" in done.stderr, done.stderr
    assert not (tmp_path / "cache/clusters" / CLUSTER / "repo").exists()


def test_fetch_names_the_versions_found_for_a_pattern_without_match(built, node_state, tmp_path):
    done = fetch(tmp_path, {"node1": node_state}, "nvidia-open=999.1*")
    assert done.returncode != 0
    assert "no version of nvidia-open matches 999.1*" in done.stderr, done.stderr
    for version in standin_versions(built, "nvidia-open"):
        assert version in done.stderr


def test_fetch_downloads_nothing_the_node_has(built, cluster, node_state, driver, tmp_path):
    installed = [DKMS] + [status_entry(built, *p.name.split("_")[:2]) for p in (cluster["repo"] / "pool").iterdir()]
    state = with_uri(node_state, built["url"], status="\n".join(installed))
    # The cluster's key: a key made now would be a change of its own.
    done = fetch(tmp_path, {"node1": state}, driver["pattern"], key_dir=cluster["tmp"] / "key")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["changed"], out["added"]) == (False, [])
    assert list((repo_of(tmp_path) / "pool").iterdir()) == []


def test_fetch_with_relative_paths(node_state, tmp_path):
    done = fetch(tmp_path, {"node1": node_state}, "nvidia-smi", cache=Path("cache"), key_dir=Path("key"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["added"][0].startswith(f"{REPO_NAME}/nvidia-smi_")


def test_a_new_key_re_signs_the_repository(node_state, tmp_path):
    """The key directory lost: the next fetch signs the index with the new key the nodes will get."""
    assert fetch(tmp_path, {"node1": node_state}, "nvidia-smi").returncode == 0
    shutil.rmtree(tmp_path / "key")
    done = fetch(tmp_path, {"node1": node_state}, "nvidia-smi")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["changed"], out["added"]) == (True, [])
    assert verifies(repo_of(tmp_path) / "InRelease", tmp_path / "key/torchrig-packages.gpg")


# --- one controller, several clusters ---


def pool_of(tmp, cluster):
    return sorted(p.name for p in (repo_of(tmp, cluster) / "pool").glob("*.deb"))


def test_another_clusters_fetch_leaves_this_clusters_index_alone(node_state, driver, tmp_path):
    """Cluster b's fetch lands between cluster a's first and second run: a's second run changes nothing."""
    first = fetch(tmp_path, {"a1": node_state}, "nvidia-smi", cluster="a")
    assert first.returncode == 0, first.stderr
    a_index = (repo_of(tmp_path, "a") / "InRelease").read_bytes()
    other = fetch(tmp_path, {"b1": node_state, "b2": node_state}, driver["pattern"], "nvidia-smi", cluster="b")
    assert other.returncode == 0, other.stderr
    again = json.loads(fetch(tmp_path, {"a1": node_state}, "nvidia-smi", cluster="a").stdout)
    assert (again["changed"], again["added"]) == (False, [])
    assert (repo_of(tmp_path, "a") / "InRelease").read_bytes() == a_index
    # Each index lists its own cluster's packages only; b's driver never reaches a's nodes.
    assert [n.split("_")[0] for n in pool_of(tmp_path, "a")] == ["nvidia-smi"]
    assert any(n.startswith("nvidia-open_") for n in pool_of(tmp_path, "b"))
    assert "nvidia-smi" in (repo_of(tmp_path, "b") / "Packages").read_text()
    assert "nvidia-open" not in (repo_of(tmp_path, "a") / "Packages").read_text()
    # The .deb both asked for was downloaded once: both pools hold the shared archive's file.
    smi = next(n for n in pool_of(tmp_path, "a") if n.startswith("nvidia-smi_"))
    shared = (tmp_path / "cache/archives" / smi).stat().st_ino
    assert (repo_of(tmp_path, "a") / "pool" / smi).stat().st_ino == shared
    assert (repo_of(tmp_path, "b") / "pool" / smi).stat().st_ino == shared


def test_fetches_at_the_same_time_are_safe(node_state, driver, tmp_path):
    """Two clusters fetched at once from a fresh controller: one signing key, both repositories whole."""
    runs = {
        cluster: subprocess.Popen(fetch_argv(tmp_path, *packages, cluster=cluster), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cluster, packages in (("a", ["nvidia-smi"]), ("b", [driver["pattern"], "nvidia-smi"]))
    }
    outs = {c: p.communicate(json.dumps({f"{c}1": node_state}), timeout=180) for c, p in runs.items()}
    for cluster, proc in runs.items():
        assert proc.returncode == 0, outs[cluster][1]
    keys = {json.loads(out)["key"]["fingerprint"] for out, _ in outs.values()}
    assert len(keys) == 1
    for cluster in ("a", "b"):
        repo = repo_of(tmp_path, cluster)
        assert verifies(repo / "InRelease", tmp_path / "key/torchrig-packages.gpg")
        assert {s["Filename"].split("/")[1] for s in stanzas((repo / "Packages").read_text())} == set(
            pool_of(tmp_path, cluster))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("arch", 'amd64"; APT::Update::Pre-Invoke:: "touch /tmp/torchrig-pwned"; //'),
        ("release", "../../../.."),
        ("os", "Debian\n"),
        ("os", None),
    ],
)
def test_a_node_reporting_a_strange_name_is_refused(node_state, tmp_path, field, value):
    """What a node reports names a directory and goes into an apt.conf on the controller: plain names only."""
    done = fetch(tmp_path, {"node1": {**node_state, field: value}}, "nvidia-smi")
    assert done.returncode != 0
    assert f"node1 reported {field} {value!r}" in done.stderr
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("name", ["", "..", ".a", "../a", "a/b", "a" * 65, "a\n"])
def test_a_strange_cluster_name_is_refused(node_state, tmp_path, name):
    done = fetch(tmp_path, {"node1": node_state}, "nvidia-smi", cluster=name)
    assert done.returncode != 0
    assert "torchrig_cluster_name" in done.stderr
    assert not (tmp_path / "cache").exists()


# --- the node's side: its apt reads the cluster's repository only ---


def node_apt(tmp_path, url, keyring):
    """A fresh apt root like a node's after the role: one source, the cluster's repository."""
    root = tmp_path / "node"
    for d in (
        "etc/apt/apt.conf.d",
        "etc/apt/sources.list.d",
        "etc/apt/preferences.d",
        "etc/apt/keyrings",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives/partial",
        "var/lib/dpkg",
        "var/log/apt",
    ):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dpkg/status").write_text(DKMS)
    (root / "etc/apt/sources.list").write_text("")
    shutil.copy(keyring, root / "etc/apt/keyrings/torchrig-packages.gpg")
    (root / "etc/apt/sources.list.d/torchrig.sources").write_text(
        f"Types: deb\nURIs: {url}\nSuites: /\nSigned-By: {root}/etc/apt/keyrings/torchrig-packages.gpg\n"
    )
    conf = root / "apt.conf"
    # Sandbox::User root: apt's _apt user cannot enter pytest's private temporary directory.
    conf.write_text(
        f'Dir "{root}/";\nDir::State::status "{root}/var/lib/dpkg/status";\nDebug::NoLocking "true";\n'
        'APT::Architecture "amd64";\nAPT::Architectures { "amd64"; };\nAPT::Sandbox::User "root";\n'
    )

    def apt(*args):
        env = dict(os.environ, APT_CONFIG=str(conf), LC_ALL="C", DEBIAN_FRONTEND="noninteractive")
        return subprocess.run(["apt-get", *args], env=env, capture_output=True, text=True, check=False)

    return root, apt


def test_node_reads_the_cluster_repository(server, cluster, driver, tmp_path):
    url = publish(server, "cluster", cluster["repo"])
    root, apt = node_apt(tmp_path, url, cluster["public"])
    update = apt("update")
    assert update.returncode == 0, update.stdout + update.stderr
    assert not [ln for ln in (update.stdout + update.stderr).splitlines() if ln.startswith(("W:", "E:", "Err"))]
    install = apt("install", "--download-only", "--yes", f"nvidia-open={driver['version']}")
    assert install.returncode == 0, install.stdout + install.stderr
    got = sorted(p.name for p in (root / "var/cache/apt/archives").glob("*.deb"))
    assert got == sorted(p.name for p in (cluster["repo"] / "pool").iterdir())


def test_node_refuses_the_cluster_repository_with_another_key(server, built, cluster, tmp_path):
    url = publish(server, "cluster", cluster["repo"])
    _, apt = node_apt(tmp_path, url, built["keyring"])
    update = apt("update")
    assert update.returncode != 0 and "NO_PUBKEY" in update.stdout + update.stderr


def test_epoch_versions_reach_the_node_over_http(server, tmp_path):
    """apt names an epoch's .deb NAME_1%3aVERSION: the node's apt asks for it quoted (%253a)
    and http.server unquotes it back to the pool's file name."""
    upstream = tmp_path / "upstream"
    pkg = tmp_path / "pkg"
    write(
        pkg,
        "/DEBIAN/control",
        "Package: torchrig-epoch\nVersion: 1:2.0-1\nArchitecture: all\n"
        "Maintainer: t <t@t.invalid>\nDescription: epoch test\n",
    )
    upstream.mkdir()
    deb = upstream / "torchrig-epoch_2.0-1_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(pkg), str(deb)], check=True, capture_output=True)
    data = deb.read_bytes()
    control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
    (upstream / "Packages").write_text(
        control + f"Filename: ./{deb.name}\nSize: {len(data)}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
    )
    packages = (upstream / "Packages").read_bytes()
    (upstream / "Release").write_text(
        f"Origin: test\nSHA256:\n {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n"
    )
    with gpg_home(tmp_path) as home:
        gpg = ["gpg", "--homedir", str(home), "--batch", "--quiet"]
        new_key = ["--passphrase", "", "--pinentry-mode", "loopback", "--quick-gen-key", "epoch test", "ed25519"]
        subprocess.run([*gpg, *new_key, "sign", "never"], check=True, capture_output=True)
        sign = [
            "--local-user",
            "epoch test",
            "--clearsign",
            "-o",
            str(upstream / "InRelease"),
            str(upstream / "Release"),
        ]
        subprocess.run([*gpg, *sign], check=True, capture_output=True)
        key = subprocess.run([*gpg, "--export", "epoch test"], check=True, capture_output=True).stdout
    state = {
        "release": "bookworm",
        "os": "debian",
        "arch": "amd64",
        "preferences": [],
        "recommends": True,
        "status_gz_b64": b64(gzip.compress(b"")),
        "sources": [
            {
                "uris": [publish(server, "epoch-upstream", upstream)],
                "suites": ["/"],
                "components": [],
                "keys": [{"name": "epoch.gpg", "b64": b64(key)}],
                "file": "/etc/apt/sources.list",
            }
        ],
    }
    done = fetch(tmp_path, {"node1": state}, "torchrig-epoch")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["added"] == [f"{REPO_NAME}/torchrig-epoch_1%3a2.0-1_all.deb"]
    repo = repo_of(tmp_path)
    root, apt = node_apt(tmp_path, publish(server, "epoch-cluster", repo), tmp_path / "key/torchrig-packages.gpg")
    assert apt("update").returncode == 0
    install = apt("install", "--download-only", "--yes", "torchrig-epoch=1:2.0-1")
    assert install.returncode == 0, install.stdout + install.stderr
    assert (root / "var/cache/apt/archives/torchrig-epoch_1%3a2.0-1_all.deb").read_bytes() == data


def test_unreadable_one_line_source_names_its_file(tmp_path):
    write(tmp_path, "/etc/apt/sources.list.d/broken.list", "deb http://x.invalid/\n")
    with pytest.raises(st.StateError, match="/etc/apt/sources.list.d/broken.list: cannot read the source line"):
        st.read_sources(str(tmp_path))


# --- a node's own sources (issue 31, item 2) ---


def signed_repo(tmp_path, name, packages):
    """A flat repository of (package, version) .debs signed with a key of its own; returns (dir, key)."""
    repo = tmp_path / name
    repo.mkdir()
    stanzas_text = []
    for package, version in packages:
        pkg = tmp_path / f"{name}-{package}-build"
        write(pkg, "/DEBIAN/control", f"Package: {package}\nVersion: {version}\nArchitecture: amd64\n"
              f"Maintainer: m <m@m.invalid>\nDescription: {name}\n")
        deb = repo / f"{package}_{version}_amd64.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(pkg), str(deb)], check=True,
                       capture_output=True)
        data = deb.read_bytes()
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
        stanzas_text.append(control + f"Filename: ./{deb.name}\nSize: {len(data)}\n"
                            f"SHA256: {hashlib.sha256(data).hexdigest()}\n")
    (repo / "Packages").write_text("\n".join(stanzas_text))
    packages_data = (repo / "Packages").read_bytes()
    (repo / "Release").write_text(
        f"Origin: {name}\nSHA256:\n {hashlib.sha256(packages_data).hexdigest()} {len(packages_data)} Packages\n")
    with gpg_home(tmp_path / name) as home:
        gpg = ["gpg", "--homedir", str(home), "--batch", "--quiet"]
        subprocess.run([*gpg, "--passphrase", "", "--pinentry-mode", "loopback", "--quick-gen-key", name,
                        "ed25519", "sign", "never"], check=True, capture_output=True)
        subprocess.run([*gpg, "--local-user", name, "--clearsign", "-o", str(repo / "InRelease"),
                        str(repo / "Release")], check=True, capture_output=True)
        key = subprocess.run([*gpg, "--export", name], check=True, capture_output=True).stdout
    return repo, key


@pytest.fixture(scope="module")
def evil(server, tmp_path_factory):
    """A source a node added itself, with its own key: nvidia-smi at a version above any real one."""
    tmp = tmp_path_factory.mktemp("evil")
    repo, key = signed_repo(tmp, "evil", [("nvidia-smi", "999.0-1")])
    return {"url": publish(server, "evil", repo), "key": key}


def with_extra_source(state, url, key, file="/etc/apt/sources.list.d/mine.list"):
    state = json.loads(json.dumps(state))
    state["sources"].append({"uris": [url], "suites": ["/"], "components": [],
                             "keys": [{"name": "mine.gpg", "b64": b64(key)}], "file": file})
    return state


def test_a_node_own_source_never_reaches_the_cluster_repository(built, evil, node_state, tmp_path):
    """node2 adds a source and key of its own offering nvidia-smi 999: the repository every node
    trusts (signed with the cluster key) holds the stand-in's nvidia-smi only, and the source is reported."""
    states = {"node1": node_state, "node2": with_extra_source(node_state, evil["url"], evil["key"])}
    done = fetch(tmp_path, states, "nvidia-smi", sources=[{"uri": built["url"]}])
    assert done.returncode == 0, done.stderr
    pool = pool_of(tmp_path, CLUSTER)
    newest = max(standin_versions(built, "nvidia-smi"), key=lambda v: [int(x) for x in v.split("-")[0].split(".")])
    assert [n for n in pool if n.startswith("nvidia-smi_")] == [f"nvidia-smi_{newest}_amd64.deb"]
    assert "999.0-1" not in (repo_of(tmp_path) / "Packages").read_text()
    assert json.loads(done.stdout)["ignored"] == [f"node2: {evil['url']} (/etc/apt/sources.list.d/mine.list)"]


def test_a_package_only_a_node_own_source_has_is_refused_naming_it(built, evil, node_state, tmp_path):
    state = with_extra_source(node_state, evil["url"], evil["key"])
    state["sources"] = state["sources"][1:]  # the node's own source only
    done = fetch(tmp_path, {"node1": state}, "nvidia-smi=999*", sources=[{"uri": built["url"]}])
    assert done.returncode != 0
    assert "no version of nvidia-smi matches 999*" in done.stderr, done.stderr
    assert f"not declared in package_source_apt_sources were left out: node1: {evil['url']}" in done.stderr
    assert not (tmp_path / "cache/clusters" / CLUSTER / "repo").exists()


def test_a_declared_fingerprint_refuses_a_node_key_swapped_for_its_own(built, evil, node_state, tmp_path):
    """The declared source with the node's key replaced by another: refused, naming both fingerprints."""
    state = json.loads(json.dumps(node_state))
    state["sources"][0]["keys"] = [{"name": "cuda-archive-keyring.gpg", "b64": b64(evil["key"])}]
    declared = [{"uri": built["url"], "fingerprints": [built["good"]]}]
    done = fetch(tmp_path, {"node1": state}, "nvidia-smi", sources=declared)
    assert done.returncode != 0
    evil_fpr = fingerprints(evil["key"], tmp_path)[0]
    assert built["good"] in done.stderr and evil_fpr in done.stderr and "Nothing was fetched" in done.stderr
    # With the right key and another beside it, only the declared one is used.
    state["sources"][0]["keys"].append({"name": "good.gpg", "b64": b64(built["keyring"].read_bytes())})
    done = fetch(tmp_path, {"node1": state}, "nvidia-smi", sources=declared)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "uri",
    ["file:///etc/apt/", "copy:/srv/x", "http://127.0.0.1:1/other/", "http://user@127.0.0.1/", "http://x.invalid/a/../b",
     "http://x.invalid/%2e%2e/b"],
)
def test_only_declared_http_sources_are_used(uri):
    repo_py = load("roles/package_source/files/apt_repo.py", "torchrig_apt_repo")
    declared = repo_py.check_declared([{"uri": "http://127.0.0.1:8000/debian"}, {"uri": "http://x.invalid/"}])
    assert repo_py.declared_for(uri, declared) is None
    assert repo_py.declared_for("https://127.0.0.1:8000/debian/dists/", declared) is not None
    assert repo_py.declared_for("http://127.0.0.1:8000/debianx", declared) is None


@pytest.mark.parametrize("entry", [{"uri": "file:///srv"}, {"uri": "http://a/", "fingerprints": ["ABC"]}, "http://a/"])
def test_a_bad_declared_source_is_refused_naming_the_setting(node_state, tmp_path, entry):
    done = fetch(tmp_path, {"node1": node_state}, "nvidia-smi", sources=[entry])
    assert done.returncode != 0 and "package_source_apt_sources" in done.stderr
    assert not (tmp_path / "cache/clusters").exists()


# --- the declared upstream sources and their publishers' keys ---

DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


def primary_fingerprints(keyring: Path, tmp_path: Path) -> set[str]:
    """The primary keys' fingerprints of a keyring file (not its subkeys')."""
    with gpg_home(tmp_path) as home:
        out = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--with-colons", "--show-keys", str(keyring)],
                             check=True, capture_output=True, text=True).stdout
    # The first fpr record after a pub record is the primary key's (rvk records may come between).
    found, in_pub = set(), False
    for line in out.splitlines():
        kind = line.split(":")[0]
        if kind == "pub":
            in_pub = True
        elif kind == "fpr" and in_pub:
            found.add(line.split(":")[9])
            in_pub = False
    return found


def declared_sources() -> list[dict]:
    return yaml.safe_load((ROOT / "roles/package_source/defaults/main.yml").read_text())["package_source_apt_sources"]


def test_debian_sources_trust_exactly_the_keys_debian_ships(tmp_path):
    """Every Debian URI is declared with the keys of Debian's own keyring package, no more, no fewer:
    a node's added key is then never used for Debian's archive, and Debian's own keys all are."""
    assert DEBIAN_KEYRING.exists(), (
        f"{DEBIAN_KEYRING} (Debian's debian-archive-keyring package) is not on this controller: "
        "make setup installs it (playbooks/controller.yml)")
    shipped = primary_fingerprints(DEBIAN_KEYRING, tmp_path)
    debian = [s for s in declared_sources() if "debian" in s["uri"]]
    assert len(debian) == 3
    for source in debian:
        assert set(source["fingerprints"]) == shipped, source["uri"]


def test_every_declared_source_names_its_keys_and_the_spec_agrees():
    sources = declared_sources()
    assert all(s.get("fingerprints") for s in sources), [s["uri"] for s in sources if not s.get("fingerprints")]
    specs = yaml.safe_load((ROOT / "roles/package_source/meta/argument_specs.yml").read_text())
    assert specs["argument_specs"]["apt"]["options"]["package_source_apt_sources"]["default"] == sources
