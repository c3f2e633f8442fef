#!/usr/bin/python
"""A job's staged data on this node (tasks/data.yml): whether a version is here, checking
and keeping a version just received, and removing old versions above the size limit.
The logic is module_utils/torchrun_data.py's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchrig.cluster.plugins.module_utils.torchrun_data import (
    data_dirs_in_use,
    digest,
    manifest,
    to_remove,
    version_inodes,
)

DOCUMENTATION = r"""
module: torchrun_data
short_description: A job's staged data versions on a node
description:
  - C(state=query) says whether the version C(digest) is staged under C(root), and names
    the newest other version (rsync's --link-dest, so that unchanged files become hard links).
  - C(state=keep) checks the version received into C(root)/.incoming-<digest> against its
    digest (every file hashed) and makes it C(root)/<digest>, read-only to the jobs.
  - C(state=prune) removes the oldest versions while the versions use more than
    C(limit_mb), never C(digest) nor one that a running job's environment file names.
options:
  root: {type: path, required: true, description: Where the versions are.}
  digest: {type: str, required: true, description: The job's version.}
  state: {type: str, choices: [query, keep, prune], default: query, description: What to do.}
  limit_mb: {type: int, default: 0, description: The most the versions may use (prune).}
  config_dir: {type: path, default: /etc/torchrig/jobs, description: The jobs' environment files (prune).}
  env_name: {type: str, default: "", description: The environment name of a job's data directory (prune).}
"""

DIGEST = re.compile(r"[0-9a-f]{64}")
INCOMING = ".incoming-"
# systemd's ActiveState values of a job unit whose processes may still read its data.
RUNNING = ("active", "activating", "deactivating", "reloading")


def versions(root: str) -> list[str]:
    return sorted(n for n in os.listdir(root) if DIGEST.fullmatch(n) and os.path.isdir(os.path.join(root, n)))


def staged_time(path: str) -> float:
    # ctime: set when the version was renamed into place (rsync sets the mtime from the source).
    return os.lstat(path).st_ctime


def running_env_texts(module: AnsibleModule, config_dir: str) -> list[str]:
    """The environment files of this node's running job units (root's files, written by
    train.yml; never a job's own)."""
    rc, out, _ = module.run_command(
        ["systemctl", "list-units", "--all", "--plain", "--no-legend", "torchrig-job@*"])
    texts = []
    # UNIT LOAD ACTIVE SUB DESCRIPTION, one unit a line.
    for line in out.splitlines() if rc == 0 else []:
        fields = line.split()
        m = re.fullmatch(r"torchrig-job@(.+)\.service", fields[0]) if len(fields) >= 3 else None
        if m and fields[2] in RUNNING:
            try:
                with open(os.path.join(config_dir, m[1] + ".env")) as f:
                    texts.append(f.read())
            except OSError:
                pass
    return texts


def main() -> None:
    module = AnsibleModule(argument_spec={
        "root": {"type": "path", "required": True},
        "digest": {"type": "str", "required": True},
        "state": {"type": "str", "choices": ["query", "keep", "prune"], "default": "query"},
        "limit_mb": {"type": "int", "default": 0},
        "config_dir": {"type": "path", "default": "/etc/torchrig/jobs"},
        "env_name": {"type": "str", "default": ""},
    })
    p = module.params
    root, want = p["root"], p["digest"]
    if not DIGEST.fullmatch(want):
        module.fail_json(msg=f"digest must be 64 hex digits, got {want!r}")
    final = os.path.join(root, want)
    incoming = os.path.join(root, INCOMING + want)

    if p["state"] == "query":
        others = [v for v in versions(root) if v != want]
        newest = max(others, key=lambda v: staged_time(os.path.join(root, v)), default="")
        module.exit_json(changed=False, present=os.path.isdir(final), path=final, incoming=incoming,
                         link_dest=os.path.join(root, newest) if newest else "")

    if p["state"] == "keep":
        if os.path.isdir(final):
            module.exit_json(changed=False, path=final)
        got = digest(manifest(incoming))
        if got != want:
            module.fail_json(msg=f"the data received into {incoming} has digest {got}, not {want}: it changed "
                                 "on the controller during the staging, or the copy is damaged. Run train.yml "
                                 "again. No job was started.")
        # Read-only to the jobs: root's, directories 0755 and files 0644 (rsync --chmod).
        subprocess.run(["chown", "-R", "root:root", incoming], check=True)
        os.rename(incoming, final)
        module.exit_json(changed=True, path=final)

    in_use = {os.path.basename(d) for d in data_dirs_in_use(running_env_texts(module, p["config_dir"]),
                                                           p["env_name"]) if os.path.dirname(d) == root}
    found = [{"name": v, "time": staged_time(os.path.join(root, v)), "inodes": version_inodes(os.path.join(root, v))}
             for v in versions(root)]
    removed = to_remove(found, p["limit_mb"] * 1024 * 1024, {want} | in_use)
    for name in removed:
        shutil.rmtree(os.path.join(root, name))
    module.exit_json(changed=bool(removed), removed=removed, in_use=sorted(in_use))


if __name__ == "__main__":
    main()
