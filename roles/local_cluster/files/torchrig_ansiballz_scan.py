"""Keep what Ansible learns from scanning a module's imports, across runs.

Installed in the controller venv (make setup) by a .pth file that calls
install(): nothing is imported then; the patch is applied when Ansible itself
imports ansible.executor.module_common.

Before Ansible sends a Python module, it finds the module_utils the module
needs: it parses the module and each module_utils file into a syntax tree and
walks the tree for imports (module_common.recursive_finder). Its own cache of
the result lives in the run's temporary directory, so every ansible-playbook
run parses ansible.module_utils.basic and its companions again for each module
it uses: on the firewall scenario that was 23 % of the controller's Python
CPU samples (py-spy). Here the import scan of each file (the names it imports,
and which of them are optional) is kept under the cache directory, keyed by
the file's content, its module name, the Ansible and the Python version:
the same bytes give the same scan, so a changed file is scanned again and
nothing stale is used. Which file a name resolves to, and what goes into the
module's zip, is still decided by Ansible at every run.

A process uses the cache only where the directory is its own (its owner is
the process's user) and closed to others. Entries are JSON, never code.
Where Ansible's module_common lacks what is patched here, nothing changes.
"""

from __future__ import annotations

# Only sys at first: the .pth runs this in every Python of the venv (a module run
# on localhost, pytest's children), and importlib.abc alone costs 30 ms of CPU.
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

TARGET = "ansible.executor.module_common"


def _usable(cache: str) -> bool:
    import os
    import stat

    try:
        os.makedirs(cache, 0o700, exist_ok=True)
    except OSError:
        return False
    info = os.lstat(cache)
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and info.st_mode & 0o077 == 0


def patch(module_common: ModuleType, cache: str) -> bool:
    """Make module_common's import scan use the cache; False where it cannot."""
    real_compile = getattr(module_common, "_compile_module_ast", None)
    real_finder = getattr(module_common, "ModuleDepFinder", None)
    if real_compile is None or real_finder is None or not _usable(cache):
        return False
    import hashlib
    import json
    import os

    from ansible.release import __version__

    salt = f"scan-v1\0{__version__}\0{sys.version_info[0]}.{sys.version_info[1]}\0".encode()

    class Source:
        """A module's source, parsed only if something needs its syntax tree."""

        def __init__(self, name: str, source: str | bytes) -> None:
            self.name, self.source, self._tree = name, source, None

        def tree(self) -> Any:
            if self._tree is None:
                self._tree = real_compile(self.name, self.source)
            return self._tree

        @property
        def body(self) -> Any:  # _get_module_metadata reads the tree's body
            return self.tree().body

    def compile_later(module_name: str, source_code: str | bytes) -> Source:
        return Source(module_name, source_code)

    real_init = real_finder.__init__

    def find_imports(self: Any, module_fqn: str, tree: Any, is_pkg_init: bool = False,
                     *args: Any, **kwargs: Any) -> None:
        if not isinstance(tree, Source):
            real_init(self, module_fqn, tree, is_pkg_init, *args, **kwargs)
            return
        data = tree.source.encode("utf-8", "surrogateescape") if isinstance(tree.source, str) else bytes(tree.source)
        key = hashlib.sha256(salt + f"{module_fqn}\0{int(bool(is_pkg_init))}\0".encode() + data).hexdigest()
        path = os.path.join(cache, f"{key}.json")
        try:
            with open(path, encoding="utf-8") as f:
                known = json.load(f)
            self.submodules = {tuple(m) for m in known["submodules"]}
            self.optional_imports = {tuple(m) for m in known["optional_imports"]}
            self.module_fqn, self.is_pkg_init = module_fqn, is_pkg_init
            return
        except (OSError, ValueError, KeyError, TypeError):
            pass
        real_init(self, module_fqn, tree.tree(), is_pkg_init, *args, **kwargs)
        tmp = f"{path}.{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"submodules": sorted(self.submodules), "optional_imports": sorted(self.optional_imports)}, f)
            os.replace(tmp, path)
        except OSError:
            pass

    module_common._compile_module_ast = compile_later
    real_finder.__init__ = find_imports
    return True


class _Hook:
    """A finder on sys.meta_path that patches module_common right after Python has run it, once."""

    def __init__(self, cache: str) -> None:
        self.cache = cache

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module
        cache = self.cache

        def exec_module(module: ModuleType) -> None:
            run(module)
            patch(module, cache)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install(cache: str) -> None:
    """Patch module_common with this cache once Ansible imports it."""
    if TARGET in sys.modules:
        patch(sys.modules[TARGET], cache)
    elif not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook(cache))
