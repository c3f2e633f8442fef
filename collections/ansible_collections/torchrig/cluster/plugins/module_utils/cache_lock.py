"""One writer at a time for an entry of the controller's cache (~/.cache/torchrig).

Several runs on one controller (clusters provisioned side by side, molecule
scenarios in parallel) may fill the same entry at the same moment. The entry
is made in a temporary directory beside it and renamed into place, so no run
sees it half made; this lock, held around "is it there? else make it", makes
the second run wait for the first and then use its entry, instead of making it
again and failing on the rename (a directory is not renamed onto a non-empty
one).

Imported by name (torchrig.cluster's module_utils) by the pytorch role's
fill_wheelhouse.py and build_training_wheel.py and the torchrun role's
job_venv.py, all run on the controller (vars of the torchrig role:
torchrig_controller_env puts the collections on their PYTHONPATH).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator


@contextlib.contextmanager
def held(entry: str) -> Iterator[None]:
    """Hold an exclusive flock on `<entry>.lock` for the body of the with statement.

    The lock file stays: removing it while another run waits on it would let a
    third run lock a new file of the same name, and two would write at once.
    The kernel drops the lock when the process ends, killed or not.
    """
    os.makedirs(os.path.dirname(os.path.abspath(entry)), exist_ok=True)
    fd = os.open(entry + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
