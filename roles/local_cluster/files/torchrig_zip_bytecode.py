"""Keep the compiled code of modules that Python imports from zip files.

Installed at every start of a Python by a .pth file in its site-packages that
calls install(): the local cluster's node image has one in the system Python's
dist-packages (for root, CACHE), and the controller venv (make setup) has one
with a cache under ~/.cache/torchrig for the user who made the venv; a user's
server has none.

Ansible sends each task's module with its module_utils as a zip, and Python
imports from a zip without writing bytecode: every task compiled the same
ansible.module_utils sources again, about 0.1 s of CPU of the 0.3 s a task
costs on a node, and 0.08 s of the 0.3 s a task run on the controller
(localhost) costs. Here the code compiled from a zip's source is kept under
the cache directory, keyed by the source's sha256 and its path inside the zip,
and loaded from there the next time. The zip's own path (a new temporary
directory for each task) is written back into the loaded code, so tracebacks
name the file Python read.

A process uses the cache only where the directory is its own (its owner is
the process's user) and closed to others: no user loads code that another user
could have written, and any other user compiles as Python does.
PYTHONDONTWRITEBYTECODE does not turn the cache off: it keeps __pycache__
directories out of source trees, and this cache is a directory of torchrig's
own. Where the Python has no zipimport._compile_source (its private helper),
nothing changes.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import stat
import sys
import types
import zipimport

CACHE = "/var/cache/torchrig-zip-bytecode"


def _usable(cache: str) -> bool:
    try:
        os.mkdir(cache, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    info = os.lstat(cache)
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and info.st_mode & 0o077 == 0


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(_renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def install(cache: str = CACHE) -> bool:
    """Use the cache from now on in this process; False where it cannot be used."""
    compile_source = getattr(zipimport, "_compile_source", None)
    if compile_source is None or not _usable(cache):
        return False
    tag = sys.implementation.cache_tag or "python"

    def cached(pathname: str, source: bytes) -> types.CodeType:
        inside = pathname.rpartition(".zip" + os.sep)[2]
        key = hashlib.sha256(inside.encode() + b"\0" + source).hexdigest()
        path = os.path.join(cache, f"{key}.{tag}")
        try:
            with open(path, "rb") as f:
                return _renamed(marshal.load(f), pathname)
        except (OSError, EOFError, ValueError, TypeError, AttributeError):
            pass
        code = compile_source(pathname, source)
        tmp = f"{path}.{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                marshal.dump(code, f)
            os.replace(tmp, path)
        except OSError:
            pass
        return code

    zipimport._compile_source = cached
    return True
