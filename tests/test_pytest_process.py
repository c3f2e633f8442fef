"""What the test modules may not do to the pytest process they share with the training
tests. pytest imports every test module before the first test runs, so a check here sees
what any of them did at import."""

from __future__ import annotations

import sys
import types


def test_no_test_module_brings_ansible_into_the_pytest_process():
    # Importing Ansible's plugin classes replaces sys.intern with an object of its own;
    # torch's compiler then fails in every training test after it ("substitute_in_graph
    # expects a function"). Load Ansible plugins in a process of their own (see
    # tests/test_torchrun_answering.py), or through ansible-playbook.
    assert isinstance(sys.intern, types.BuiltinFunctionType), sys.intern
    assert not [m for m in sys.modules if m == "ansible.plugins" or m.startswith("ansible.plugins.")]
