"""The names of the extra variables typed on ansible-playbook's command line (-e, @files
included), so that train.yml can refuse a name it does not know (`-e epoch=3`).

Ansible has no variable that tells an extra variable from an inventory or play variable;
the command line's -e arguments are the only record of what was typed. They are parsed
here the way Ansible parses them (ansible.utils.vars.load_extra_vars, which reads
ansible.context.CLIARGS). A playbook that imports train.yml with vars types nothing.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: torchrun_request_typed
short_description: The names of the -e variables typed on the command line
description:
  - Returns the sorted names of the extra variables given with -e / --extra-vars (key=value,
    YAML/JSON and @file), parsed as Ansible parses them. Takes no terms.
"""

RETURN = r"""
_raw:
  description: The names, sorted.
  type: list
  elements: str
"""

from ansible.plugins.lookup import LookupBase  # noqa: E402
from ansible.utils.vars import load_extra_vars  # noqa: E402


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return sorted(str(name) for name in load_extra_vars(self._loader))
