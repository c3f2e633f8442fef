#!/usr/bin/python
"""List a job's run directory on the node, as the job's own user, for the fetch.

One module run returns the names in one string and the sizes summed (not
ansible.builtin.find's thirty fields a file), so that a job of 10,000 files lists in one
small reply.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.torchrun_outputs import list_outputs

DOCUMENTATION = r"""
module: torchrun_outputs
short_description: List a torchrig job's run directory without following links
description:
  - Walks run_dir and returns the regular files' relative paths, their count and size. Links are
    counted and named, never followed; directories named in skip_dirs and files ending in
    skip_suffixes are left out. Changes nothing. Run it as the job's user (become_user),
    so that it sees only what the job could read.
options:
  run_dir: {description: The job's run directory., type: path, required: true}
  skip_dirs: {description: Directory names left out at any depth., type: list, elements: str, default: []}
  skip_suffixes: {description: File name endings left out., type: list, elements: str, default: [.tmp]}
  times_of: {description: Files whose mtime is returned under times., type: list, elements: str, default: []}
"""

RETURN = r"""
exists: {description: Whether run_dir is a directory (not a link)., type: bool, returned: always}
names: {description: "Paths relative to run_dir, sorted, NUL between each two.", type: str, returned: always}
count: {description: How many names., type: int, returned: always}
bytes: {description: Their size in bytes, all together., type: int, returned: always}
largest: {description: "The largest few as [path, size].", type: list, returned: always}
links: {description: The first links found (relative paths); links_count counts them all., type: list, returned: always}
unreadable: {description: Directories the reader could not open., type: list, returned: always}
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={"run_dir": {"type": "path", "required": True},
                       "skip_dirs": {"type": "list", "elements": "str", "default": []},
                       "skip_suffixes": {"type": "list", "elements": "str", "default": [".tmp"]},
                       "times_of": {"type": "list", "elements": "str", "default": []}},
        supports_check_mode=True,
    )
    p = module.params
    module.exit_json(changed=False, **list_outputs(p["run_dir"], p["skip_dirs"], p["skip_suffixes"], p["times_of"]))


if __name__ == "__main__":
    main()
