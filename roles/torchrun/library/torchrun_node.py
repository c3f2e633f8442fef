#!/usr/bin/python
"""What the torchrun role needs to know about a node, in one module call.

train.yml used to gather every Ansible fact, then stat torchrun and ask systemd
about the unit: three round trips and the slowest part of a launch. This
module reads only what the job's settings are made of.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.torchrun_net import (
    interface_of,
    jobs_hosting_port,
    nft_set_ranges,
    outside_peers,
    parse_addresses,
)
from ansible_collections.torchrig.cluster.plugins.module_utils.torchrun_gpus import (
    NVIDIA_GPUS_DIR,
    RUNNING_STATES,
    count_gpus,
)

DOCUMENTATION = r"""
module: torchrun_node
short_description: The facts a torchrun job needs on a node
description:
  - Returns the node's usable CPUs, its GPUs (from the NVIDIA driver's /proc
    entries, without CUDA), the cluster address and the interface that holds
    it, whether the venv has torchrun, and the job unit's state and whether its
    template is installed. Changes nothing.
options:
  address:
    description: The node's cluster address (torchrig_cluster_address, decided by the torchrig role).
    type: str
    required: true
  venv:
    description: The venv that must hold bin/torchrun.
    type: path
    required: true
  unit:
    description: The job's systemd unit.
    type: str
    required: true
  rdzv_port:
    description: The job's rendezvous port when this node hosts it (0 when it does not).
    type: int
    default: 0
  config_dir:
    description: Where the jobs' .env files are.
    type: path
    default: /etc/torchrig/jobs
  gpus_dir:
    description: Where the NVIDIA driver lists its GPUs, one directory each (tests point it elsewhere).
    type: path
    default: /proc/driver/nvidia/gpus
  peers:
    description: The cluster addresses of the job's other nodes, to look up in the firewall's peers.
    type: list
    elements: str
    default: []
  env_names:
    description: The job contract's environment names (rdzv_endpoint, rdzv_is_host), to read other jobs' .env files.
    type: dict
    required: true
  user:
    description: The job's own user, whose uid is returned when it exists ("" asks for none).
    type: str
    default: ""
  run_dir:
    description: The job's run directory, whose owner is returned ("" asks for none).
    type: str
    default: ""
  probe_private_shm:
    description: >-
      Ask systemd whether a unit can have a /dev/shm of its own here (TemporaryFileSystem=,
      which needs a mount namespace: a container without CAP_SYS_ADMIN cannot make one).
      It runs /bin/true in a transient unit with that setting.
    type: bool
    default: false
  firewall_required:
    description: >-
      Fail, naming what to do, when torchrig's firewall (table inet torchrig) is not loaded here:
      the job's rendezvous store and workers would take connections from anywhere.
    type: bool
    default: true
"""

RETURN = r"""
cpus: {description: CPUs this node may run on (its affinity mask), type: int, returned: always}
gpus: {description: NVIDIA GPUs the loaded driver sees (0 without a driver), type: int, returned: always}
address: {description: The cluster address, type: str, returned: always}
interface: {description: The interface that holds the address, type: str, returned: always}
torchrun: {description: Whether the venv has bin/torchrun, type: bool, returned: always}
unit_state: {description: The unit's ActiveState (inactive when it never ran), type: str, returned: always}
running: {description: Whether that state counts as running (RUNNING_STATES), type: bool, returned: always}
unit_template: {description: Whether systemd can load the unit (its template is installed), type: bool,
                returned: always}
rdzv_taken_by:
  description: Other jobs running here that host a rendezvous on rdzv_port.
  type: list
  returned: always
user_uid:
  description: The uid of the user named by `user` (null when there is no such user).
  type: int
  returned: always
run_dir_uid:
  description: The owner of run_dir when it is a directory, -1 when it is something else (a link), null when missing.
  type: int
  returned: always
private_shm:
  description: Whether a unit can have a /dev/shm of its own here (null when not asked).
  type: bool
  returned: always
firewall_loaded:
  description: Whether torchrig's firewall (table inet torchrig, from the firewall role) is loaded here.
  type: bool
  returned: always
firewall_refuses:
  description: >-
    Those of peers that torchrig's firewall here (table inet torchrig, from the
    firewall role) does not let in; empty where that table is not loaded.
  type: list
  returned: always
firewall_peers:
  description: The addresses that firewall lets in, as addresses or first-last ranges.
  type: list
  returned: always
"""


def rdzv_taken_by(module: AnsibleModule) -> list[str]:
    """Other jobs whose unit is active here and whose rendezvous this node hosts on rdzv_port."""
    config_dir, this = module.params["config_dir"], module.params["unit"]
    try:
        names = [n[:-4] for n in os.listdir(config_dir) if n.endswith(".env")]
    except FileNotFoundError:
        return []
    envs = {}
    for job in names:
        unit = f"torchrig-job@{job}.service"
        if unit == this:
            continue
        rc, state, _ = module.run_command(["systemctl", "is-active", unit])
        if state.strip() not in RUNNING_STATES:
            continue
        with open(os.path.join(config_dir, job + ".env")) as f:
            envs[job] = f.read()
    return jobs_hosting_port(envs, module.params["rdzv_port"], module.params["env_names"])


FIREWALL_MISSING = (
    "This node has no torchrig firewall (nftables table inet torchrig is not loaded{why}), so the "
    "job's rendezvous store and workers would take connections from anywhere. Run provision.yml for "
    "this node (its firewall role loads the table), or, where another firewall guards the training "
    "ports, say so in the inventory: torchrig_firewall: false. No job was started.")


def firewall_loaded(module: AnsibleModule) -> tuple[bool, str]:
    """(whether table inet torchrig is loaded in the kernel, why not)."""
    nft = shutil.which("nft")
    if nft is None:
        return False, "; the nft command is missing"
    rc, _, err = module.run_command([nft, "list", "table", "inet", "torchrig"])
    return rc == 0, "" if rc == 0 else f"; nft says: {err.strip() or f'exit status {rc}'}"


def firewall_peers(module: AnsibleModule) -> tuple[list[str], list[str]]:
    """(the job's peers that the firewall role's rules here keep out, what they let in).

    Read from the kernel's sets, which is what drops the packets, not from the rules file.
    """
    nft = shutil.which("nft")
    if not module.params["peers"] or nft is None:
        return [], []
    sets = []
    for name in ("peers4", "peers6"):
        rc, out, _ = module.run_command([nft, "-j", "list", "set", "inet", "torchrig", name])
        if rc == 0:
            sets.append(out)
    if not sets:  # no torchrig table: the firewall role does not manage this node
        return [], []
    try:
        ranges = [r for text in sets for r in nft_set_ranges(text)]
    except ValueError as e:
        module.fail_json(msg=f"reading the firewall's peers: {e}")
    allowed = [str(a) if a == b else f"{a}-{b}" for a, b in ranges]
    return outside_peers(module.params["peers"], ranges), allowed


def user_uid(name: str) -> int | None:
    """The uid of user `name`, None when it does not exist (or no name is given)."""
    if not name:
        return None
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def dir_owner(path: str) -> int | None:
    """The uid owning directory path; -1 when path is something else (a link); None when missing."""
    if not path:
        return None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_uid if stat.S_ISDIR(st.st_mode) else -1


def private_shm(module: AnsibleModule) -> bool:
    """Whether systemd can give a unit a /dev/shm of its own here: it is asked, with a unit
    that has just that setting, as no file says whether it can make a mount namespace."""
    rc, _, _ = module.run_command(["systemd-run", "--wait", "--quiet", "--collect",
                                   "--property=TemporaryFileSystem=/dev/shm", "/bin/true"])
    return rc == 0


def main() -> None:
    module = AnsibleModule(
        argument_spec={"address": {"type": "str", "required": True},
                       "venv": {"type": "path", "required": True},
                       "unit": {"type": "str", "required": True},
                       "rdzv_port": {"type": "int", "default": 0},
                       "config_dir": {"type": "path", "default": "/etc/torchrig/jobs"},
                       "gpus_dir": {"type": "path", "default": NVIDIA_GPUS_DIR},
                       "peers": {"type": "list", "elements": "str", "default": []},
                       "env_names": {"type": "dict", "required": True},
                       "user": {"type": "str", "default": ""},
                       "run_dir": {"type": "str", "default": ""},
                       "probe_private_shm": {"type": "bool", "default": False},
                       "firewall_required": {"type": "bool", "default": True}},
        supports_check_mode=True,
    )
    ip = shutil.which("ip")
    if ip is None:
        module.fail_json(msg="the ip command (iproute2) is missing on this node")
    _, addrs, _ = module.run_command([ip, "-o", "-4", "addr", "show"], check_rc=True)
    try:
        address = module.params["address"]
        interface = interface_of(address, parse_addresses(addrs))
    except ValueError as e:
        module.fail_json(msg=str(e))
    # LoadState is "not-found" when the unit's template is not installed.
    rc, show, _ = module.run_command(["systemctl", "show", "--property=ActiveState,LoadState",
                                      module.params["unit"]])
    unit = dict(line.split("=", 1) for line in show.splitlines() if "=" in line) if rc == 0 else {}
    # Fail closed: without the table nothing limits who reaches the job's ports.
    loaded, why = firewall_loaded(module)
    if module.params["firewall_required"] and not loaded:
        module.fail_json(msg=FIREWALL_MISSING.format(why=why), firewall_loaded=False)
    refuses, allowed = firewall_peers(module) if loaded else ([], [])
    module.exit_json(
        firewall_loaded=loaded,
        changed=False,
        rdzv_taken_by=rdzv_taken_by(module) if module.params["rdzv_port"] else [],
        firewall_refuses=refuses,
        firewall_peers=allowed,
        cpus=len(os.sched_getaffinity(0)),
        gpus=count_gpus(module.params["gpus_dir"]),
        address=address,
        interface=interface,
        torchrun=os.access(os.path.join(module.params["venv"], "bin", "torchrun"), os.X_OK),
        unit_state=unit.get("ActiveState") or "inactive",
        running=unit.get("ActiveState") in RUNNING_STATES,
        unit_template=unit.get("LoadState") == "loaded",
        user_uid=user_uid(module.params["user"]),
        run_dir_uid=dir_owner(module.params["run_dir"]),
        private_shm=private_shm(module) if module.params["probe_private_shm"] else None,
    )


if __name__ == "__main__":
    main()
