"""The job contract: what the torchrun role and the training package say to each other.

One definition of each name: the environment the job's unit gives every job
(`/etc/torchrig/jobs/<job>.env`), the files a job leaves in its run directory for
train.yml, and the exit status and signal that end a job for good. The package imports
this module; the roles read it through one filter (roles/torchrig/filter_plugins/
torchrig_contract.py), which loads this file by path, as torchrun_request loads config.py.

Standard library only, and no `from __future__ import annotations`: it is loaded by file
path on the controller, outside the package and without torch.
"""

import signal

# Every name of the job's environment starts with this; a user's `-e env` may not.
ENV_PREFIX = "TORCHRIG_"

# The job's environment, by role: the key is what the roles and tests call it, the value
# the variable's name. torchrig.launch, torchrig.worker and torchrig.dist read them; the
# unit's command line takes the first nine.
ENV = {
    "job": "TORCHRIG_JOB",
    # MIN:MAX for an elastic job.
    "nnodes": "TORCHRIG_NNODES",
    "nproc_per_node": "TORCHRIG_NPROC_PER_NODE",
    "rdzv_endpoint": "TORCHRIG_RDZV_ENDPOINT",
    "join_timeout": "TORCHRIG_JOIN_TIMEOUT",
    # An elastic job's wait for more nodes once it has its minimum.
    "last_call_timeout": "TORCHRIG_LAST_CALL_TIMEOUT",
    # 1 on the node that hosts the rendezvous store, else 0.
    "rdzv_is_host": "TORCHRIG_RDZV_IS_HOST",
    "local_addr": "TORCHRIG_LOCAL_ADDR",
    "max_restarts": "TORCHRIG_MAX_RESTARTS",
    "pg_timeout": "TORCHRIG_PG_TIMEOUT",
    # The job's nodes as name=address pairs, so that a node that does not join is named.
    "nodes": "TORCHRIG_NODES",
    "run_dir": "TORCHRIG_RUN_DIR",
    # What a job writes here comes back to runs/<job>/.
    "output_dir": "TORCHRIG_OUTPUT_DIR",
    # The job's data (train.yml's -e data=), staged on the node's own disk, read-only to
    # the job; unset when the job has none. The built-in trainer's default --data-dir.
    "data_dir": "TORCHRIG_DATA_DIR",
    # What each worker runs: a script path, or -m MODULE.
    "entrypoint": "TORCHRIG_ENTRYPOINT",
    # The entry point's extra arguments, a JSON list: systemd splits `$VAR` on the unit's
    # command line at every space and knows no quotes.
    "args": "TORCHRIG_ARGS",
    # The job's one backend, nccl or gloo, decided across its hosts.
    "backend": "TORCHRIG_BACKEND",
    # The GPUs a job holds on a node (by PCI bus order), in its .gpus file: what
    # the GPU choice reads of every running job there.
    "gpus": "TORCHRIG_GPUS",
    # Set by torchrig.worker inside a worker, not by the role: a SIGTERM kept for the
    # trainer (`python -m torchrig.worker` runs as __main__, so a module variable would
    # not reach the trainer's import of it).
    "stop_requested": "TORCHRIG_STOP_REQUESTED",
}

# The files a job leaves in its run directory, by role.
FILES = {
    # A worker's failure that a retry would repeat (torchrig.worker).
    "fatal": "fatal.json",
    # The job cannot go on from this node (torchrig.launch): nodes that did not join within
    # join_timeout, or this node failed after the others had finished for good.
    "ended": "ended.json",
    # A worker's newest failure on this node, its traceback (torchrig.worker): what
    # torchrig.launch reports when the job cannot go on after it.
    "failure": "failure.json",
    # Written by rank 0: the node whose output directory goes to the top of runs/<job>/.
    "rank0": "rank0.json",
    # The trainer's rank 0, at the end: the run is complete.
    "summary": "summary.json",
    # The trainer's rank 0: one JSON object a line.
    "metrics": "metrics.jsonl",
}
# The run directory's subdirectory a job's own outputs go to (TORCHRIG_OUTPUT_DIR).
OUTPUT_DIR = "output"
# The trainer's checkpoints, in the run directory; a directory of this name anywhere in a
# run directory (a script's own) stays on the nodes at a fetch unless asked for.
CHECKPOINT_DIR = "checkpoints"

# The ends that a restart would repeat, which the unit does not restart
# (RestartPreventExitStatus) and after which it disables itself.
# torchrig.launch's exit status when the job cannot go on from this node: nodes did not
# join within join_timeout, or its workers failed after the other nodes had finished.
EXIT_NODES_MISSING = 3
# The signal torchrig.worker ends its launcher with after a failure that a retry would
# repeat. systemd names it without "SIG" in $EXIT_STATUS.
FATAL_SIGNAL = "SIGUSR2"


# How torchrig.launch's journal line begins when the kernel ended processes of the job at
# its memory limit; the report (roles/torchrun/tasks/report.yml) looks for it.
MEMORY_NOTE = "torchrig: memory limit:"


def fatal_signal() -> signal.Signals:
    """FATAL_SIGNAL as Python's signal."""
    return signal.Signals[FATAL_SIGNAL]


def contract() -> dict:
    """The whole contract as plain data, for the roles' filter."""
    return {
        "env_prefix": ENV_PREFIX,
        "env": dict(ENV),
        "files": dict(FILES),
        "output_dir": OUTPUT_DIR,
        "checkpoint_dir": CHECKPOINT_DIR,
        "exit_nodes_missing": EXIT_NODES_MISSING,
        "fatal_signal": FATAL_SIGNAL,
        "memory_note": MEMORY_NOTE,
        # As systemd's $EXIT_STATUS shows it.
        "fatal_signal_short": FATAL_SIGNAL.removeprefix("SIG"),
    }
