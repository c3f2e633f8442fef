"""The fetch of a job's results from a real node (systemd in a container, reached over
SSH): rsync as the job's own user, links never followed, root-only files never home,
the limits checked before anything moves, each run in its own directory.

The node's run directory is written here as a job would leave it; the fetch is the
torchrun role's own (tasks/fetch_job.yml, what playbooks/fetch.yml runs)."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import run

pytestmark = pytest.mark.nodes

NAME = "torchrig-pytest-fetch"
JOB = "fetchme"
USER = "tj-pytest-fetch"
RUN = f"/var/lib/torchrig/runs/{JOB}"

# A job's run directory: its outputs (modes of their own), a checkpoint, and links a job
# made to root-only files and to a root-only directory.
SETUP = f"""
set -e
id {USER} >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin {USER}
rm -rf {RUN}; mkdir -p {RUN}/output/sub {RUN}/checkpoints /etc/torchrig/jobs
head -c 3000000 /dev/urandom > {RUN}/output/result.bin; chmod 0640 {RUN}/output/result.bin
echo notes > {RUN}/output/sub/notes.txt; chmod 0600 {RUN}/output/sub/notes.txt
for i in $(seq 1 300); do echo $i > {RUN}/output/sub/f$i.txt; done
echo ckpt > {RUN}/checkpoints/ckpt_1.pt
ln -s /etc/shadow {RUN}/output/shadow
ln -s /etc/ssh/ssh_host_ed25519_key {RUN}/output/hostkey
ln -s /root {RUN}/output/rootdir
echo swap > {RUN}/output/swap
chown -R {USER}:{USER} {RUN}; chmod 0700 {RUN}
"""

# While the fetch runs, the job swaps an output between a file and a link to /etc/shadow.
SWAPPER = (f"while :; do ln -sfn /etc/shadow {RUN}/output/swap.new && mv -T {RUN}/output/swap.new {RUN}/output/swap; "
           f"echo swap > {RUN}/output/swap.new && mv -T {RUN}/output/swap.new {RUN}/output/swap; done")

PLAY = """
- name: Fetch as playbooks/fetch.yml does
  hosts: node1
  become: true
  gather_facts: false
  tasks:
    - name: Fetch
      ansible.builtin.include_role:
        name: torchrun
        tasks_from: fetch_job
      vars:
        torchrun_job: {job}
        torchrun_fetch_dir: {fetch}
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    """One local-cluster node of its own, torn down afterwards."""
    inv = tmp_path_factory.mktemp("fetch-inventory")
    base = ["ansible-playbook", "-i", str(inv), "playbooks/local-cluster.yml",
            "-e", f"local_cluster_name={NAME}", "-e", f"local_cluster_inventory_dir={inv}"]
    proc = run([*base, "-e", "nodes=1"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield inv
    run([*base, "-e", "state=absent"])


def on_node(inv: Path, script: str) -> str:
    proc = run(["ansible", "-i", str(inv), "node1", "-b", "-m", "ansible.builtin.shell", "-a", script])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def fetch(inv: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    play = tmp_path / "fetch.yml"
    play.write_text(PLAY.format(job=JOB, fetch=tmp_path / "runs" / JOB))
    return run(["ansible-playbook", "-i", str(inv), str(play), *extra], timeout=300)


def secrets(inv: Path) -> list[bytes]:
    """What a root-only file holds on the node: none of it may come home."""
    out = run(["podman", "exec", f"{NAME}-node1", "sh", "-c",
               "cat /etc/shadow; echo; cat /etc/ssh/ssh_host_ed25519_key"]).stdout
    lines = [line.encode() for line in out.splitlines() if len(line.strip()) > 8]
    assert lines
    return lines


def test_results_come_home_as_the_jobs_user_without_links_nor_root_only_files(node: Path, tmp_path: Path) -> None:
    on_node(node, SETUP)
    on_node(node, f"echo 20261205T100000Z > /etc/torchrig/jobs/{JOB}.run")
    swapper = subprocess.Popen(["podman", "exec", f"{NAME}-node1", "setpriv", "--reuid", USER, "--regid", USER,
                                "--clear-groups", "sh", "-c", SWAPPER])
    try:
        proc = fetch(node, tmp_path)
    finally:
        swapper.kill()
        run(["podman", "exec", f"{NAME}-node1", "pkill", "-u", USER])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    runs = tmp_path / "runs"
    got = runs / "fetchme.runs" / "20261205T100000Z"
    assert os.readlink(runs / JOB) == "fetchme.runs/20261205T100000Z"
    home = got / "nodes" / "node1"
    files = sorted(p.relative_to(home).as_posix() for p in home.rglob("*") if p.is_file() or p.is_symlink())
    # No link came (as a link or as what it points to), nor the checkpoint.
    assert not [p for p in home.rglob("*") if p.is_symlink()]
    assert not {"output/shadow", "output/hostkey", "checkpoints/ckpt_1.pt"} & set(files)
    assert not any(f.startswith("output/rootdir") for f in files)
    assert "output/result.bin" in files and len([f for f in files if f.startswith("output/sub/f")]) == 300
    # The bytes are the node's, and each file keeps its mode.
    node_hash = on_node(node, f"sha256sum {RUN}/output/result.bin").split()[-2]
    assert hashlib.sha256((home / "output/result.bin").read_bytes()).hexdigest() == node_hash
    assert stat.S_IMODE((home / "output/result.bin").stat().st_mode) == 0o640
    assert stat.S_IMODE((home / "output/sub/notes.txt").stat().st_mode) == 0o600
    # The results are the controller user's alone.
    for d in (runs / "fetchme.runs", got):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    # Nothing of a root-only file came home, whatever the swap made of output/swap.
    everything = b"".join(p.read_bytes() for p in got.rglob("*") if p.is_file())
    assert not [s for s in secrets(node) if s in everything]


def test_a_rerun_gets_a_directory_of_its_own_and_the_limits_hold(node: Path, tmp_path: Path) -> None:
    on_node(node, SETUP)
    on_node(node, f"echo 20261205T100000Z > /etc/torchrig/jobs/{JOB}.run")
    assert fetch(node, tmp_path).returncode == 0
    first = tmp_path / "runs" / "fetchme.runs" / "20261205T100000Z"
    # The next run writes other outputs; the first run's directory keeps its own.
    on_node(node, f"echo 20261205T110000Z > /etc/torchrig/jobs/{JOB}.run; rm {RUN}/output/result.bin; "
                  f"echo second > {RUN}/output/second.txt; chown {USER} {RUN}/output/second.txt")
    proc = fetch(node, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    second = tmp_path / "runs" / "fetchme.runs" / "20261205T110000Z"
    assert os.readlink(tmp_path / "runs" / JOB) == "fetchme.runs/20261205T110000Z"
    assert (second / "nodes/node1/output/second.txt").exists()
    assert not (second / "nodes/node1/output/result.bin").exists()
    assert (first / "nodes/node1/output/result.bin").exists()
    assert not (first / "nodes/node1/output/second.txt").exists()
    # Over a limit: nothing moves, and the message names the figures and the setting.
    on_node(node, f"echo 20261205T120000Z > /etc/torchrig/jobs/{JOB}.run")
    proc = fetch(node, tmp_path, "-e", "torchrun_fetch_limit_files=100")
    assert proc.returncode != 0
    assert "303 files, more than torchrun_fetch_limit_files (100)" in proc.stdout, proc.stdout[-3000:]
    assert not (tmp_path / "runs" / "fetchme.runs" / "20261205T120000Z" / "nodes" / "node1").exists()
    # Checkpoints come only when asked for.
    proc = fetch(node, tmp_path, "-e", "torchrun_fetch_checkpoints=true")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (tmp_path / "runs" / "fetchme.runs" / "20261205T120000Z" / "nodes/node1/checkpoints/ckpt_1.pt").exists()


def test_results_of_an_older_torchrig_are_kept_aside(node: Path, tmp_path: Path) -> None:
    old = tmp_path / "runs" / JOB
    old.mkdir(parents=True)
    (old / "summary-old.txt").write_text("old")
    on_node(node, SETUP)
    on_node(node, f"echo 20261205T130000Z > /etc/torchrig/jobs/{JOB}.run")
    proc = fetch(node, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    kept = [p for p in (tmp_path / "runs" / "fetchme.runs").iterdir() if p.name.startswith("earlier-")]
    assert len(kept) == 1 and (kept[0] / "summary-old.txt").read_text() == "old"
    assert (tmp_path / "runs" / JOB).is_symlink()
