#!/bin/bash
# Wait until node2 holds a checkpoint of JOB while the job runs, then inject
# FAULT on node2 from the controller. Prints one JSON line: the job, the fault,
# the newest checkpoint step node2 had just before it, and what was done.
#   inject.sh JOB worker|service|container
#   worker     SIGKILL to the job's worker process (its worker-rank*.pid)
#   service    systemctl kill -s KILL: every process of the unit at once
#   container  podman stop (systemd shuts the node down), then podman start
#   power      podman kill (no shutdown: a power loss), podman start 15 s later
# Exits 1 when no checkpoint appears within 600 s or the job is not running
# at that moment: then the fault could not be injected mid-job.
#   lost       node1 drops node2's packets, then podman kill: node2 is gone
#              without a word and stays down
#   revive     after lost: node1 hears node2 again, node2 starts (same address)
#   gone       podman kill, not started again (a power loss for good)
#   drain      files/drain.yml on node2: the drain before a change that ends
#              the node's jobs, refused first without drain=true; its output
#              goes to RESULTS_DIR/JOB.drain.out
# FAULT_NODE names another node than node2 (the elastic job's third node).
set -u
job=$1 fault=$2
node=${FAULT_NODE:-torchrig-m-cluster-node2}
# node2's training address: the job's traffic, so the one node1 drops.
net=torchrig-m-cluster-train
run=/var/lib/torchrig/runs/$job
unit=torchrig-job@$job.service
saved=${MOLECULE_EPHEMERAL_DIRECTORY:-/tmp}/node2-address
start=$SECONDS
# The node keeps its addresses across a restart, as a real host does: they
# are fixed in its container (molecule/shared/create.yml). A stopped
# container shows none, so the address is read while it runs.
# It keeps its /etc/hosts too, as a real host's disk does: podman writes the
# file anew at each start, which drops the cluster's names (common role);
# with the gateway's DNS dropped (drop_egress.sh) nothing else resolves them.
save_address() {
    podman inspect --format "{{(index .NetworkSettings.Networks \"$net\").IPAddress}}" "$node" > "$saved"
    read -r ip < "$saved"
    podman exec "$node" cat /etc/hosts > "$saved.hosts"
}
start_node() {
    podman start "$node" > /dev/null || return 1
    podman exec -i "$node" sh -c 'cat > /etc/hosts' < "$saved.hosts"
}
drop_rule() { podman exec torchrig-m-cluster-node1 nft -a list chain inet torchrig input | sed -n "s/.*ip saddr $1 drop # handle \([0-9]*\)/\1/p"; }
if [ "$fault" = revive ]; then
    read -r ip < "$saved"
    for handle in $(drop_rule "$ip"); do
        podman exec torchrig-m-cluster-node1 nft delete rule inet torchrig input handle "$handle" || exit 1
    done
    start_node || exit 1
    echo '{"fault": "revive", "done": "node1 hears node2 again; node2 started"}'
    exit 0
fi
# Waits on the node itself, in one podman exec polling every 0.1 s, for the
# job's first checkpoint there, checks that the unit still runs and runs
# ACTION there at once; prints the checkpoint's step. A 2-epoch job can end
# within seconds of its first checkpoint: polling from the controller (a
# podman exec every 0.3 s, each taking seconds on a busy controller) once
# killed node2's service after node1 had finished, and the fault hit a job
# already done.
at_checkpoint() {
    podman exec "$node" sh -c '
        run=$1 unit=$2 job=$3 action=$4 deadline=$(($(date +%s) + 600))
        # A glob, not ls: nothing is started per poll.
        while set -- "$run"/checkpoints/ckpt_*.pt; [ ! -e "$1" ]; do
            if [ "$(date +%s)" -gt "$deadline" ]; then echo "no checkpoint of $job after 600 s" >&2; exit 1; fi
            sleep 0.1
        done
        state=$(systemctl show --property=ActiveState --value "$unit")
        if [ "$state" != active ]; then echo "$job is $state once its first checkpoint exists: too late" >&2; exit 1; fi
        eval "$action" >&2 || exit 1
        ls "$run/checkpoints" | sed -n "s/^ckpt_0*\([0-9][0-9]*\)\.pt\$/\1/p" | sort -n | tail -n 1' sh "$run" "$unit" "$job" "$1"
}
case $fault in
    worker)
        step=$(at_checkpoint 'pids=$(cat "$run"/worker-rank*.pid); echo "kill -KILL $pids"; kill -KILL $pids') || exit 1
        done="kill -KILL of the worker (its worker-rank*.pid), on the node at its first checkpoint" ;;
    service)
        step=$(at_checkpoint 'systemctl kill --signal=KILL "$unit"') || exit 1
        done="systemctl kill --signal=KILL $unit, on the node at its first checkpoint" ;;
    container)
        # The node as a whole is shut down from outside it, right after.
        save_address
        step=$(at_checkpoint true) || exit 1 ;;
    power|lost|gone)
        # The node dies from outside it, right after; its job is frozen first
        # (SIGSTOP, on the node at the checkpoint) so that it cannot finish in
        # the second the kill takes from the controller: the job trains for
        # seconds only, and once the kill came as node1 finished (f-power
        # resumed from nothing). Frozen or not, a killed node's processes
        # die the same way.
        [ "$fault" = gone ] || save_address
        step=$(at_checkpoint 'systemctl kill --signal=STOP "$unit"') || exit 1 ;;
    drain)
        # Frozen at the checkpoint too, so that the job still runs when the
        # drain (an ansible-playbook run, seconds) reaches the node; let go
        # below once the drain's stop has begun.
        step=$(at_checkpoint 'systemctl kill --signal=STOP "$unit"') || exit 1 ;;
    *) echo "unknown fault $fault" >&2; exit 2 ;;
esac
case $fault in
    worker|service) ;;
    drain)
        out=${RESULTS_DIR:-/tmp}/$job.drain.out
        ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 ANSIBLE_STDOUT_CALLBACK=default ANSIBLE_CALLBACK_RESULT_FORMAT=json \
            ansible-playbook -i "$MOLECULE_EPHEMERAL_DIRECTORY/inventory" "$(dirname "$0")/drain.yml" -e "fault_job=$job" > "$out" 2>&1 &
        drain=$!
        # The stop runs the unit's ExecStop, which sends SIGTERM to the frozen
        # workers and waits: the unit is `deactivating` until they go on
        # (SIGCONT), vote to stop, checkpoint and exit.
        podman exec "$node" sh -c '
            deadline=$(($(date +%s) + 120))
            until [ "$(systemctl show --property=ActiveState --value "$1")" = deactivating ]; do
                if [ "$(date +%s)" -gt "$deadline" ]; then echo "$1 was not stopped within 120 s" >&2; exit 1; fi
                sleep 0.1
            done
            systemctl kill --signal=CONT "$1"' sh "$unit" || { kill "$drain"; exit 1; }
        wait "$drain" || { echo "files/drain.yml failed (exit $?): see $out" >&2; exit 1; }
        done="files/drain.yml on $node: refused without drain=true, then drained (its output: $job.drain.out)" ;;
    container|power)
        t0=$SECONDS
        if [ "$fault" = power ]; then
            killed_at=$(date +%s.%N)
            podman kill --signal KILL "$node" > /dev/null || exit 1
            sleep 15
        else
            podman stop --time 120 "$node" > /dev/null || exit 1
        fi
        stopped=$((SECONDS - t0))
        start_node || exit 1
        if [ "$fault" = power ]; then
            done="podman kill at ${killed_at}, podman start ${stopped} s later (address $ip kept)"
        else
            done="podman stop (took ${stopped} s), podman start (address $ip kept)"
        fi ;;
    lost)
        podman exec torchrig-m-cluster-node1 nft insert rule inet torchrig input ip saddr "$ip" drop || exit 1
        killed_at=$(date +%s.%N)
        podman kill --signal KILL "$node" > /dev/null || exit 1
        done="node1 drops $ip; podman kill at ${killed_at}; not started again" ;;
    gone)
        killed_at=$(date +%s.%N)
        podman kill --signal KILL "$node" > /dev/null || exit 1
        done="podman kill of $node at ${killed_at}; not started again" ;;
esac
printf '{"job": "%s", "fault": "%s", "checkpoint_step": %s, "waited_s": %s, "killed_at": %s, "done": "%s"}\n' \
    "$job" "$fault" "$step" "$((SECONDS - start))" "${killed_at:-null}" "$done"
