#!/bin/bash
# unit_end.sh NODE JOB: how a job's unit ended on a node, as one JSON object:
# its state, result, main status, service restarts, whether it is still
# enabled, how many workers started (their "torchrig: rank" lines in the
# journal), and ended.json if torchrig.launch wrote one.
set -euo pipefail
node=$1 job=$2
podman exec "$node" bash -c '
set -euo pipefail
unit=torchrig-job@'"$job"'.service
show() { systemctl show --property="$1" --value "$unit"; }
journal=$(journalctl --unit="$unit" --output=cat --no-pager)
ended=$(cat /var/lib/torchrig/runs/'"$job"'/ended.json 2>/dev/null || echo null)
printf "{\"state\": \"%s\", \"result\": \"%s\", \"main_status\": %s, \"service_restarts\": %s, \"enabled\": \"%s\", \"workers\": %s, \"ended\": %s}\n" \
  "$(show ActiveState)" "$(show Result)" "$(show ExecMainStatus)" "$(show NRestarts)" \
  "$(systemctl is-enabled "$unit" || true)" \
  "$(grep -c "^torchrig: rank" <<< "$journal" || true)" "$ended"
'
