#!/usr/bin/env bash
# molecule/shared/run-scenario.sh NAME: `molecule test -s NAME` with a deadline.
# A scenario that hangs (a job that never ends, a node that stopped answering)
# fails after TORCHRIG_SCENARIO_TIMEOUT seconds (default 1500, about twice the
# slowest scenario on a slow day) instead of using up CI's whole run. Before
# its nodes are removed, their jobs' units and journals are printed and kept in
# TORCHRIG_SCENARIO_JOURNALS, so that the reason can be read afterwards.
set -uo pipefail
scenario=$1
limit=${TORCHRIG_SCENARIO_TIMEOUT:-1500}
journals=${TORCHRIG_SCENARIO_JOURNALS:-${TMPDIR:-/tmp}/torchrig-scenario-journals.log}

timeout --kill-after=30 "$limit" molecule test -s "$scenario"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  {
    echo "=== molecule $scenario ran past ${limit}s; its nodes' jobs follow ==="
    for node in $(podman ps --format '{{.Names}}' | grep "^torchrig-m-$scenario-"); do
      echo "--- $node"
      podman exec "$node" sh -c \
        'systemctl list-units "torchrig-job@*" --all --no-pager --plain; journalctl -u "torchrig-job@*" --no-pager -n 300 -o short-iso'
    done
  } 2>&1 | tee "$journals"
  molecule destroy -s "$scenario" > /dev/null 2>&1
  echo "molecule $scenario ran past ${limit}s (TORCHRIG_SCENARIO_TIMEOUT); the nodes' journals are in $journals"
fi
exit "$rc"
