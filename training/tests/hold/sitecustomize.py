"""Test-only: hold rank 0 right after it saved the checkpoint of step TORCHRIG_TEST_HOLD_STEP,
until the file TORCHRIG_TEST_HOLD_GO exists.

A fault test puts this directory on PYTHONPATH so that it can kill a worker while the run
is surely mid-way: the other ranks wait at rank 0's next collective, alive. Without the
hold, a test process starved of CPU for the few seconds the rest of the run takes (a busy
CI machine) found the workers already done, and its SIGKILL hit nothing.
"""

import os

if os.environ.get("RANK") == "0" and os.environ.get("TORCHRIG_TEST_HOLD_GO"):
    import time
    from pathlib import Path

    from torchrig import checkpoint

    _save_atomic = checkpoint.save_atomic
    _hold_step = checkpoint.path_for(Path("."), int(os.environ["TORCHRIG_TEST_HOLD_STEP"])).name
    _go = Path(os.environ["TORCHRIG_TEST_HOLD_GO"])

    def _save_then_hold(obj, path):
        _save_atomic(obj, path)
        while Path(path).name == _hold_step and not _go.exists():
            time.sleep(0.05)

    checkpoint.save_atomic = _save_then_hold
