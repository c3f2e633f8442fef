"""Load the roles' plain-Python parts by path: they live in Ansible's plugin
directories (module_utils, filter_plugins), not in an installed package. The
Python the roles share, the torchrig.cluster collection's module_utils, is
imported by name, as the roles' plugins import it (shared())."""

import importlib
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
# ansible_collections is a namespace package (Ansible's bundled collections in
# site-packages are one part of it): collections/ adds torchrig.cluster to it.
if str(ROOT / "collections") not in sys.path:
    sys.path.insert(0, str(ROOT / "collections"))


# What the controller's scripts that import the collection by name get as PYTHONPATH
# (the torchrig role's torchrig_controller_pythonpath, in a test).
COLLECTIONS = str(ROOT / "collections")


def shared(name):
    """The torchrig.cluster collection's module_utils `name`, the module the plugins use."""
    return importlib.import_module(f"ansible_collections.torchrig.cluster.plugins.module_utils.{name}")


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
