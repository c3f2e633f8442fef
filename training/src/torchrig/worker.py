"""What every worker of a torchrig job runs first, then the job's own entry point.

    torchrun ... -m torchrig.worker SCRIPT.py [ARGS...]
    torchrun ... -m torchrig.worker -m MODULE [ARGS...]

Two things torchrun cannot do by itself:

- A SIGTERM that arrives before the entry point has set its own handler (a stop
  during rendezvous or while torch imports) is kept instead of killing the process.
  Killed by the signal, the worker counted as failed and torchrun restarted the worker
  group in the middle of `systemctl stop`. torchrig's trainer reads the kept request
  (contract.ENV['stop_requested']) and checkpoints at its first step; any other entry
  point ends at once with status 0, as a stopped job.
- A failure that would fail the same way on every retry (a usage error, an import or
  syntax error, a missing file) ends the job at once: its lines go to the run directory
  (contract.FILES['fatal']) and the worker ends its launcher with contract.FATAL_SIGNAL,
  which the job's unit does not restart (RestartPreventExitStatus). Retrying would cost
  torchrun's restarts and systemd's, over a minute, before anyone saw the error.
- Any other failure is retried once. When the retry fails the same way (the same
  exception type and message, raised at the same line), the job ends as above: a bug in
  a script is found on the second try, not the twelfth. A failure between nodes (a peer
  gone, a collective's timeout) is left to torchrun and systemd, as it may heal when
  the peer is back.

It also hands the entry point the job's extra arguments (a JSON list, so that quoted
words stay whole), creates the job's output directory, and on rank 0 writes a note into
the run directory, naming the node whose outputs go to runs/<job>/ (names: torchrig.contract).
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from types import FrameType

from torchrig import contract

FATAL_FILE = contract.FILES["fatal"]
FAILURE_FILE = contract.FILES["failure"]
USAGE_EXIT_STATUS = 2  # argparse's, and torchrig.train's
# Errors that come back unchanged on a retry of the same code and files.
DETERMINISTIC = (SyntaxError, ImportError, FileNotFoundError, NotADirectoryError, IsADirectoryError)
# Failures between nodes, which may heal when a peer is back: never ended early.
TRANSIENT_TYPES = ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError")
TRANSIENT_WORDS = ("gloo", "nccl", "connection", "timed out", "timeout", "socket", "peer")
# A failure noted less than this before an attempt started was the attempt just before.
REPEAT_WINDOW_S = 120.0

# Set in the environment, not a module variable: `python -m torchrig.worker` runs this
# file as __main__, so the trainer's `import torchrig.worker` would get a fresh copy.
STOP_REQUESTED_ENV = contract.ENV["stop_requested"]
# The job's extra arguments, a JSON list: systemd splits `$VAR` on the unit's command line
# at every space and knows no quotes, so "two words" would arrive as two arguments.
ARGS_ENV = contract.ENV["args"]
# Written by rank 0 into the run directory: train.yml takes rank 0's node's output
# directory to the top of runs/<job>/. Under c10d any node can be rank 0, and another one
# after a restart, so the newest note wins.
RANK0_FILE = contract.FILES["rank0"]


def _keep_sigterm(signum: int, frame: FrameType | None) -> None:
    os.environ[STOP_REQUESTED_ENV] = "1"


def _stop_plain_entry(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def fatal_record(kind: str, status: int, lines: list[str], why: str) -> dict:
    """What FATAL_FILE holds: enough for train.yml to say what failed, where, and how."""
    return {
        "kind": kind,
        "why": why,
        "exit_status": status,
        "node": socket.gethostname(),
        "rank": int(os.environ.get("RANK", 0)),
        "time": time.time(),
        "lines": [line.rstrip("\n") for chunk in lines for line in chunk.splitlines()],
    }


def write_fatal(run_dir: Path, record: dict) -> None:
    """Write FATAL_FILE once per node: the first rank to fail deterministically wins."""
    path = run_dir / FATAL_FILE
    tmp = run_dir / f".{FATAL_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    try:
        os.link(tmp, path)  # fails if another rank wrote it first
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


def note_failure(run_dir: Path, exc: BaseException) -> None:
    """Keep this failure's traceback in FAILURE_FILE (the newest wins): torchrig.launch
    reports it when the job cannot go on after it (its peers have finished)."""
    if isinstance(exc, SystemExit) and exc.code in (0, None):
        return
    lines = [line.rstrip("\n") for chunk in traceback.format_exception(exc)
             for line in chunk.splitlines()]
    record = {"node": socket.gethostname(), "rank": int(os.environ.get("RANK", 0)),
              "time": time.time(), "lines": lines[-60:]}
    path = run_dir / FAILURE_FILE
    tmp = path.with_name(f".{FAILURE_FILE}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass  # the journal has the traceback too


def classify(exc: BaseException) -> tuple[str, int] | None:
    """(kind, exit status) for a failure that a retry would repeat; None for any other."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code == USAGE_EXIT_STATUS:
            return "usage error", USAGE_EXIT_STATUS
        return None
    if isinstance(exc, SyntaxError):
        return "syntax error", 1
    if isinstance(exc, ImportError):
        return "import error", 1
    if isinstance(exc, DETERMINISTIC):
        return "missing file", 1
    return None


def failure_signature(exc: BaseException) -> list[str] | None:
    """What makes two failures the same: type, message and the line that raised.

    None for a failure a retry may heal: one between nodes (torch.distributed's errors,
    found by name so that torch need not be imported here; a connection or a timeout),
    or an interrupt.
    """
    if isinstance(exc, (KeyboardInterrupt, ConnectionError, TimeoutError)):
        return None
    if isinstance(exc, SystemExit):
        return None if exc.code in (0, None) else ["SystemExit", str(exc.code)]
    if any(cls.__name__ in TRANSIENT_TYPES for cls in type(exc).__mro__):
        return None
    message = str(exc)
    if any(word in message.lower() for word in TRANSIENT_WORDS):
        return None
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return [type(exc).__qualname__, message[:2000], where]


def failed_the_same_way_before(run_dir: Path, signature: list[str], started: float) -> bool:
    """Note this failure; True when the attempt just before this one ended the same way.

    "Just before": the note is from under REPEAT_WINDOW_S before this process started,
    the time torchrun or systemd takes to start the next attempt. One note per local rank,
    in the node's run directory.
    """
    path = run_dir / f".failure-{os.environ.get('LOCAL_RANK', '0')}.json"
    try:
        previous = json.loads(path.read_text())
    except (OSError, ValueError):
        previous = {}
    same = (isinstance(previous, dict) and previous.get("signature") == signature
            and 0 <= started - float(previous.get("time", 0)) < REPEAT_WINDOW_S)
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps({"signature": signature, "time": time.time()}) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass  # a run directory that cannot be written only costs the early end
    return same


def end_launcher(status: int) -> None:
    """Stop torchrun (this worker's parent) without a restart by torchrun or systemd, then
    this process at once.

    At once: a normal interpreter exit runs a process group's teardown while torchrun
    stops, and a worker stuck there ignores SIGTERM; nothing of it should be left for
    systemd's stop of the unit to wait on (a stop that waited TimeoutStopSec, 120 s, was
    seen after a job ended this way; that the teardown was the cause is not proven).
    """
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getppid(), contract.fatal_signal())
        os._exit(status)


class StderrTail:
    """sys.stderr that also keeps its last lines: argparse prints a usage error there."""

    def __init__(self, stream, keep: int = 40) -> None:  # type: ignore[no-untyped-def]
        self.stream = stream
        self.keep = keep
        self.text = ""

    def write(self, text: str) -> int:
        self.text = "\n".join((self.text + text).split("\n")[-self.keep - 1:])
        return self.stream.write(text)

    def lines(self) -> list[str]:
        return [line for line in self.text.split("\n") if line.strip()]

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.stream, name)


def run_entry(argv: list[str]) -> None:
    """Run SCRIPT.py or -m MODULE with the rest as its arguments, as `python` would."""
    if not argv or argv[0] in ("-h", "--help"):
        raise SystemExit(__doc__)
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("torchrig.worker: -m needs a module name")
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, str(Path(argv[0]).resolve().parent))
        runpy.run_path(argv[0], run_name="__main__")


def job_args() -> list[str]:
    """The job's extra arguments (ARGS_ENV), taken out of the environment (the entry
    point's own children must not add them again)."""
    text = os.environ.pop(ARGS_ENV, "")
    if not text:
        return []
    try:
        args = json.loads(text)
    except ValueError:
        args = None
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise SystemExit(f"torchrig.worker: {ARGS_ENV} must be a JSON list of strings, "
                         f"got {text!r}")
    return args


def note_job_files() -> None:
    """Create the output directory; on rank 0, say which node rank 0 runs on."""
    output = os.environ.get(contract.ENV["output_dir"])
    if output:
        Path(output).mkdir(parents=True, exist_ok=True)
    run_dir = os.environ.get(contract.ENV["run_dir"])
    if run_dir and os.environ.get("RANK") == "0" and os.environ.get("TORCHELASTIC_RUN_ID"):
        path = Path(run_dir) / RANK0_FILE
        tmp = path.with_name(f".{RANK0_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps({
            "node": socket.gethostname(), "time": time.time(),
            "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))}) + "\n")
        os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv) + job_args()
    torchrig_entry = argv[:2] == ["-m", "torchrig.train"]
    # torchrig's trainer checkpoints on a kept request; a script that never sets a
    # handler of its own just ends, with status 0 so that torchrun does not restart it.
    signal.signal(signal.SIGTERM, _keep_sigterm if torchrig_entry else _stop_plain_entry)
    tail = StderrTail(sys.stderr)
    sys.stderr = tail
    started = time.time()
    run_dir = Path(os.environ.get(contract.ENV["run_dir"], "."))
    try:
        note_job_files()
        run_entry(argv)
    except BaseException as exc:
        note_failure(run_dir, exc)
        found = classify(exc)
        why = "not retried (it would fail the same way)"
        if found is None:
            signature = failure_signature(exc)
            if signature is None or not failed_the_same_way_before(run_dir, signature, started):
                raise
            status = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
            found = f"{signature[0]}, the same on a retry", status
            why = "not retried again (the retry failed the same way)"
        kind, status = found
        lines = tail.lines() if isinstance(exc, SystemExit) else traceback.format_exception(exc)
        sys.stderr = tail.stream
        write_fatal(run_dir, fatal_record(kind, status, lines, why))
        sys.stderr.write(f"torchrig: {kind} (exit status {status}); {why}, the job ends.\n")
        sys.stderr.flush()
        if not isinstance(exc, SystemExit):
            sys.stderr.writelines(lines)
            sys.stderr.flush()
        end_launcher(status)
        return status
    return 0


if __name__ == "__main__":
    status = main()
    if status == 0 and os.environ.get("TORCHELASTIC_RUN_ID"):
        # The entry's work is done: run the exit handlers it registered, then end without
        # the interpreter's teardown. torch's gloo threads have aborted a finished worker
        # there ("terminate called without an active exception", exit -6; the cluster
        # scenario, torch 2.14.1), and torchrun then took the job for failed.
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    sys.exit(status)
