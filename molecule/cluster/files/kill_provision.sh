#!/bin/bash
# Start provision.yml against the scenario's nodes and kill it when PHASE is
# reached on node2, the way a crash would: the controller's ansible-playbook
# and all it started (SIGKILL to its process group), and on both nodes the
# processes it ran (the module, apt/dpkg, pip), which a dying SSH session or
# a power loss takes with it. Prints what was killed and node2's state.
#   kill_provision.sh apt|pip LOG
# PHASE apt: dpkg is unpacking or configuring a package; pip: pip is
# unpacking torch into the venv. Exits 1 when provision.yml ends or 15
# minutes pass before that phase: the fault could not be injected.
set -u
phase=$1 log=$2
nodes=(torchrig-m-cluster-node1 torchrig-m-cluster-node2 torchrig-m-cluster-node3)
site=/opt/torchrig/venv/lib/python3.11/site-packages

reached() {
    case $phase in
        apt) podman exec "${nodes[1]}" pgrep -x dpkg >/dev/null 2>&1 ;;
        pip) podman exec "${nodes[1]}" sh -c "test -d $site/torch && ! test -e $site/torch-*.dist-info/RECORD" 2>/dev/null ;;
        *) echo "unknown phase $phase" >&2; exit 2 ;;
    esac
}

# The inventory directory: its group_vars pin the stack.
setsid ansible-playbook -i "$(dirname "$MOLECULE_INVENTORY_FILE")" "$MOLECULE_PROJECT_DIRECTORY/provision.yml" >"$log" 2>&1 &
pid=$!
start=$SECONDS
# A crash of the controller takes all of ansible-playbook: its process group,
# and its workers, which Ansible detaches each into a session of its own
# (os.setsid), so that the group's kill alone left one behind.
kill_run() {
    local groups=("-$pid") worker
    for worker in $(pgrep -P "$pid"); do groups+=("-$worker"); done
    kill -KILL -- "${groups[@]}" 2>/dev/null
}
until reached; do
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "provision.yml ended (status $(wait "$pid"; echo $?)) before the $phase phase; log $log"
        exit 1
    fi
    if (( SECONDS - start > 900 )); then
        kill_run
        echo "the $phase phase was not reached in 900 s; log $log"
        exit 1
    fi
    sleep 0.5
done
kill_run
for node in "${nodes[@]}"; do
    # Whatever provision.yml runs on the node: the module (AnsiballZ) and the
    # commands under it.
    victims=$(podman exec "$node" pgrep -d ' ' -f 'AnsiballZ|ansible-tmp|/bin/pip|pip install|dpkg|apt-get|/usr/bin/apt' || true)
    [ -n "$victims" ] && podman exec "$node" kill -KILL $victims 2>/dev/null
    echo "$node: killed [${victims}] after $((SECONDS - start)) s in the $phase phase"
done
sleep 1
podman exec "${nodes[1]}" sh -c "
  echo dpkg audit: \$(dpkg --audit | head -3 | tr '\n' ' ')
  if test -x /opt/torchrig/venv/bin/python; then
    /opt/torchrig/venv/bin/python -c 'import torch' >/dev/null 2>&1 && echo import torch: ok || echo import torch: fails
  else echo venv: none; fi"
