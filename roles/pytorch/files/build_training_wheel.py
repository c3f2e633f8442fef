"""Builds the training package's wheel on the controller, once per source hash.

The wheel and the marker `.built` appear together or not at all: pip builds
into a temporary directory beside DEST, which is renamed to DEST when it
succeeded. Two runs building the same DEST at once (clusters provisioned side
by side from one checkout) take turns on `DEST.lock` (torchrig.cluster's cache_lock): the
second finds DEST built and uses it. Without that, both pip runs copied the
wheel into one directory while the first run might already be pushing it, and
both built in the same source tree (setuptools builds in place: build/,
*.egg-info).

Prints one JSON line, {"dir": DEST, "built": true|false} (false: DEST was
there already). Exit 1 with pip's output on stderr when the build fails.

usage: python build_training_wheel.py SOURCE_DIR DEST
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from ansible_collections.torchrig.cluster.plugins.module_utils import cache_lock

BUILT = ".built"


def build(source: str, dest: str) -> bool:
    """Build source's wheel into dest unless dest is built already; whether this call built it."""
    with cache_lock.held(dest):
        if os.path.isfile(os.path.join(dest, BUILT)):
            return False
        # Left by a build that was killed when builds still went into dest itself.
        shutil.rmtree(dest, ignore_errors=True)
        tmp = tempfile.mkdtemp(prefix=".partial-", dir=os.path.dirname(os.path.abspath(dest)))
        try:
            # pip's output goes to stderr: stdout is this script's JSON.
            subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", tmp, source],
                           check=True, stdout=sys.stderr)
            open(os.path.join(tmp, BUILT), "w").close()
            os.rename(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        sys.exit(__doc__)
    source, dest = argv[1], argv[2]
    try:
        built = build(source, dest)
    except subprocess.CalledProcessError:
        print(f"build_training_wheel: pip could not build the wheel of {source} (its output above)", file=sys.stderr)
        return 1
    print(json.dumps({"dir": dest, "built": built}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
