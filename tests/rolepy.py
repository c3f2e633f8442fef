"""Load the roles' plain-Python parts by path: they live in Ansible's plugin
directories (module_utils, filter_plugins), not in an installed package."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def load(relpath, name):
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_mod = load("roles/preflight/module_utils/torchrig_gpu.py", "torchrig_gpu")
stack_mod = load("roles/preflight/filter_plugins/torchrig_stack.py", "torchrig_stack")
MATRIX_TEXT = (ROOT / "roles/preflight/files/compat_matrix.yml").read_text()


def fixture_text(name):
    return (FIXTURES / "gpu" / name).read_text()
