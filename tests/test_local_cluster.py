"""The local container cluster: bad input changes nothing; up, scale, down.

These drive playbooks/local-cluster.yml for real (podman, systemd, sshd). They
use their own cluster name and inventory directory so that they never touch
the cluster `make up` started.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import podman_names, run

pytestmark = pytest.mark.nodes

NAME = "torchrig-pytest"


def cluster(tmp: Path, *extra: str, env: dict[str, str] | None = None):
    return run(["ansible-playbook", "-i", str(tmp), "playbooks/local-cluster.yml",
                "-e", f"local_cluster_name={NAME}", "-e", f"local_cluster_inventory_dir={tmp}",
                *extra], env=env)


def recap(output: str) -> dict[str, dict[str, int]]:
    """Per-host counters from the PLAY RECAP lines."""
    hosts = {}
    for line in output.splitlines():
        m = re.match(r"^(\S+)\s+:\s+(.*)$", line)
        if m and "ok=" in m.group(2):
            hosts[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return hosts


def nothing_made(tmp: Path) -> None:
    assert podman_names("container", f"{NAME}-") == []
    assert podman_names("network", NAME) == []
    assert not (tmp / "hosts.yml").exists()


@pytest.fixture
def inv(tmp_path: Path):
    yield tmp_path
    # The refusal tests leave nothing; a playbook run to remove nothing costs seconds each.
    if (podman_names("container", f"{NAME}-") or podman_names("network", NAME)
            or (tmp_path / "hosts.yml").exists()):
        cluster(tmp_path, "-e", "state=absent")


@pytest.mark.parametrize("nodes", ["0", "abc", "-1", "2.5"])
def test_bad_node_count_is_refused_before_anything_changes(inv: Path, nodes: str) -> None:
    proc = cluster(inv, "-e", f"nodes={nodes}")
    assert proc.returncode != 0
    expected = f"nodes must be a whole number of at least 1 (e.g. -e nodes=2); got '{nodes}'"
    assert expected in proc.stdout
    assert "Nothing was changed" in proc.stdout
    nothing_made(inv)


def test_too_many_nodes_is_refused(inv: Path) -> None:
    proc = cluster(inv, "-e", "nodes=17")
    assert proc.returncode != 0
    assert "local_cluster_nodes must be a whole number from 1 to 16; got 17" in proc.stdout
    nothing_made(inv)


def _path_without(tmp: Path, *missing: str) -> str:
    """A PATH with every command of /usr/bin and /bin except the missing ones."""
    fake = tmp / "fakebin"
    fake.mkdir()
    for d in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            if name in missing or (fake / name).exists():
                continue
            (fake / name).symlink_to(os.path.join(d, name))
    return str(fake)


@pytest.mark.parametrize(("missing", "advice"), [
    (("podman",), "Run `make setup`, which installs it with apt."),
    (("podman", "apt-get"), "This system has no apt, so `make setup` cannot install it"),
])
def test_missing_podman_is_explained(tmp_path: Path, missing: tuple[str, ...], advice: str) -> None:
    inv = tmp_path / "inv"
    inv.mkdir()
    path = f"{Path(sys.executable).parent}:{_path_without(tmp_path, *missing)}"
    proc = cluster(inv, "-e", "nodes=2", env={"PATH": path})
    assert proc.returncode != 0
    assert "podman was not found on this machine." in proc.stdout
    assert advice in proc.stdout
    nothing_made(inv)


def ping(inv: Path) -> dict[str, str]:
    proc = run(["ansible", "-i", str(inv), "all", "-m", "ansible.builtin.ping", "-o"])
    return {line.split()[0]: line for line in proc.stdout.splitlines() if "|" in line}


def push(inv: Path, src: Path) -> subprocess.CompletedProcess[str]:
    """Push src/ to every node as the pytorch role pushes its wheels: rsync over
    Ansible's own SSH options (ansible.cfg's ssh_args), host keys checked."""
    return run(["ansible", "-i", str(inv), "all", "-b", "-m", "ansible.posix.synchronize",
                "-a", f"src={src}/ dest=/var/cache/torchrig-push/ compress=false use_ssh_args=true"
                " verify_host=true"])


def push_wheels(inv: Path, src: Path) -> dict[str, str]:
    """push(), then host name -> the pushed file's size on that node."""
    proc = push(inv, src)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run(["ansible", "-i", str(inv), "all", "-b", "-o", "-m", "ansible.builtin.command",
                "-a", "stat -c %s /var/cache/torchrig-push/torch.whl"])
    return {line.split()[0]: line.split()[-1] for line in proc.stdout.splitlines() if "|" in line}


def test_up_scale_down(inv: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    # Two nodes, reached over real SSH with strict host key checking.
    proc = cluster(inv, "-e", "nodes=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(podman_names("container", f"{NAME}-")) == [f"{NAME}-node1", f"{NAME}-node2"]
    replies = ping(inv)
    assert sorted(replies) == ["node1", "node2"]
    assert all('"ping": "pong"' in r for r in replies.values()), replies
    assert "StrictHostKeyChecking=yes" in (inv / "hosts.yml").read_text()
    assert len((inv / "known_hosts").read_text().splitlines()) == 2

    # rsync takes ssh_args into its --rsh: the wheel push must reach both nodes.
    wheels = tmp_path_factory.mktemp("wheels")
    (wheels / "torch.whl").write_bytes(b"wheel" * 10000)
    assert push_wheels(inv, wheels) == {"node1": "50000", "node2": "50000"}
    # ...and checks the nodes' host keys: with node2's key swapped for node1's in
    # known_hosts, the push to node2 is refused.
    known = (inv / "known_hosts").read_text()
    keys = [line.split(None, 1) for line in known.splitlines()]
    (inv / "known_hosts").write_text(f"{keys[0][0]} {keys[0][1]}\n{keys[1][0]} {keys[0][1]}\n")
    refused = push(inv, wheels)
    (inv / "known_hosts").write_text(known)
    assert refused.returncode != 0 and "Host key verification failed" in refused.stdout + refused.stderr, (
        refused.stdout + refused.stderr)

    # A second run changes nothing.
    proc = cluster(inv, "-e", "nodes=2")
    assert proc.returncode == 0, proc.stdout
    assert recap(proc.stdout)["localhost"]["changed"] == 0, proc.stdout

    # Scale to three, then back to one: nodes beyond the count go away.
    assert cluster(inv, "-e", "nodes=3").returncode == 0
    assert sorted(ping(inv)) == ["node1", "node2", "node3"]
    assert cluster(inv, "-e", "nodes=1").returncode == 0
    assert podman_names("container", f"{NAME}-") == [f"{NAME}-node1"]
    assert sorted(ping(inv)) == ["node1"]

    # A node is a real host: systemd as PID 1, sshd running, its own address.
    out = run(["podman", "exec", f"{NAME}-node1", "systemctl", "is-active", "ssh"]).stdout
    assert out.strip() == "active"
    info = json.loads(run(["podman", "inspect", f"{NAME}-node1"], check=True).stdout)[0]
    assert info["NetworkSettings"]["Networks"][NAME]["IPAddress"]

    # Two networks, as GPU servers have: management (ansible_host; the hostname
    # resolves there) and training (torchrig_cluster_address), both in the inventory.
    def addresses() -> tuple[str, str]:
        info = json.loads(run(["podman", "inspect", f"{NAME}-node1"], check=True).stdout)[0]
        nets = info["NetworkSettings"]["Networks"]
        return nets[NAME]["IPAddress"], nets[f"{NAME}-train"]["IPAddress"]

    management, training = addresses()
    assert management != training
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    node1 = hosts["all"]["children"]["cluster"]["children"]["cpu_nodes"]["hosts"]["node1"]
    assert (node1["ansible_host"], node1["torchrig_cluster_address"]) == (management, training)
    resolved = run(["podman", "exec", f"{NAME}-node1", "getent", "hosts", "node1"]).stdout.split()
    assert resolved[:1] == [management], resolved
    # A node that loses power and boots again keeps both addresses, as a real host does.
    run(["podman", "kill", f"{NAME}-node1"], check=True)
    run(["podman", "start", f"{NAME}-node1"], check=True)
    assert addresses() == (management, training)

    # Down removes containers, network and the generated inventory.
    proc = cluster(inv, "-e", "state=absent")
    assert proc.returncode == 0, proc.stdout
    nothing_made(inv)
    assert not (inv / "known_hosts").exists()
    assert not (inv / "ssh").exists()


def test_a_preview_on_a_bare_cluster_says_what_would_change_and_changes_nothing(inv: Path) -> None:
    # `provision.yml --check --diff` before the first real run: every role previewed on
    # nodes that have nothing yet (no training user, no venv, no firewall).
    assert cluster(inv, "-e", "nodes=2").returncode == 0
    proc = run(["ansible-playbook", "-i", str(inv), "provision.yml", "--check", "--diff",
                "-e", f"torchrig_cluster_name={NAME}"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    counts = recap(proc.stdout)
    assert sorted(counts) == ["node1", "node2"], counts
    assert all(c["failed"] == 0 and c["unreachable"] == 0 and c["changed"] > 0 for c in counts.values()), counts
    # It says what would change: the nodes' names in /etc/hosts, the firewall's ruleset.
    assert "+# BEGIN torchrig cluster nodes (ansible managed)" in out
    assert "+table inet torchrig {" in out, out[-3000:]
    assert re.search(r"--check: the training user '+torchrig'+ does not exist on node1 yet", re.sub(r"\s+", " ", out))
    # ...and changed nothing there.
    for node in ("node1", "node2"):
        left = run(["podman", "exec", f"{NAME}-{node}", "sh", "-c",
                    "getent passwd torchrig; ls -d /opt/torchrig /etc/nftables.d /etc/torchrig 2>/dev/null; "
                    "grep -c 'BEGIN torchrig cluster' /etc/hosts"]).stdout
        assert left.split() == ["0"], (node, left)
    # A real run afterwards would need the key pair the preview made on the controller.
    assert (Path.home() / ".local/share/torchrig/ssh" / NAME / "id_ed25519").exists()
