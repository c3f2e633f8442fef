#!/usr/bin/env bash
# molecule/shared/run-scenario.sh NAME: `molecule test -s NAME` with a deadline.
# A scenario that hangs (a job that never ends, a node that stopped answering)
# fails after TORCHRIG_SCENARIO_TIMEOUT seconds (default 2400) instead of using
# up CI's whole run. The cluster scenario alone took 1,420 s on an idle 2-core
# machine (2026-12-07), and ran past a 1,500 s limit in two CI-style runs that
# day. When a scenario fails for any reason, its nodes are kept until their jobs' units,
# journals and firewall counters are printed and kept in
# TORCHRIG_SCENARIO_JOURNALS: an intermittent failure can then be read
# afterwards, not only reproduced.
set -uo pipefail
scenario=$1
limit=${TORCHRIG_SCENARIO_TIMEOUT:-2400}
journals=${TORCHRIG_SCENARIO_JOURNALS:-${TMPDIR:-/tmp}/torchrig-scenario-journals-$scenario.log}

# --destroy=never: the nodes outlive a failure long enough to be read; they
# are removed below in every case. It also skips the test's first destroy, so
# nodes (or molecule's record of them) left by an earlier run that was cut
# short are removed here first: otherwise create is skipped as "already
# created" and the scenario finds no nodes.
molecule destroy -s "$scenario" > /dev/null 2>&1
timeout --kill-after=30 "$limit" molecule test -s "$scenario" --destroy=never
rc=$?
if [ "$rc" -ne 0 ]; then
  {
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      echo "=== molecule $scenario ran past ${limit}s; its nodes' jobs follow ==="
    else
      echo "=== molecule $scenario failed (exit $rc); its nodes' jobs follow ==="
    fi
    for node in $(podman ps --format '{{.Names}}' | grep "^torchrig-m-$scenario-"); do
      echo "--- $node"
      podman exec "$node" sh -c '
        systemctl list-units "torchrig-job@*" --all --no-pager --plain
        journalctl -u "torchrig-job@*" --no-pager -n 300 -o short-iso
        echo "--- $(hostname): nftables counters"
        nft list table inet torchrig 2>&1 | grep -E "counter|dport|saddr" | head -40'
    done
  } > "$journals" 2>&1
  tail -n 400 "$journals"
  echo "molecule $scenario failed (exit $rc); its nodes' journals are in $journals"
fi
molecule destroy -s "$scenario" > /dev/null 2>&1
exit "$rc"
