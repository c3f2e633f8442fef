#!/bin/bash
# Start ansible-playbook ARGS (provision.yml --limit NODE) and kill it when
# PHASE is reached on NODE, the way a crash would: the controller's
# ansible-playbook and all it started (SIGKILL to its process group), and on
# the node the processes it ran (the module, apt/dpkg, pip), which a dying
# SSH session or a power loss takes with it. Prints what was killed and the
# node's state.
#   kill_provision.sh apt|pip LOG NODE ARGS...
# PHASE apt: dpkg is installing the base packages; pip: pip is unpacking
# torch into the venv. Exits 1 when the run ends or 15 minutes pass before
# that phase: the fault could not be injected.
# The base packages install in about 3 s, less than a poll through podman
# exec takes on a busy machine: so for the apt phase dpkg is held after its
# first action (a post-invoke hook that waits while a file exists), and the
# kill lands while dpkg runs, leaving packages unpacked and not configured, as
# a crash between apt's dpkg calls does. The hook and its file are removed
# right after the kill (or when the run ends without it).
# Only NODE is touched: the run is limited to it, and in both phases it has
# not reached the tasks it delegates to the other nodes (ssh_trust and
# firewall come after the stack), whose own jobs and modules go on.
set -u
phase=$1 log=$2 node=$3
shift 3
site=/opt/torchrig/venv/lib/python3.11/site-packages
hold_conf=/etc/dpkg/dpkg.cfg.d/zz-torchrig-test-hold
hold_file=/run/torchrig-test-hold-dpkg
unhold() {
    [ "$phase" = apt ] && podman exec "$node" rm -f "$hold_conf" "$hold_file"
}
if [ "$phase" = apt ]; then
    podman exec "$node" sh -c "echo 'post-invoke=while test -e $hold_file; do sleep 1; done' > $hold_conf && touch $hold_file" \
        || { echo "could not install the dpkg hold on $node"; exit 1; }
fi

reached() {
    case $phase in
        apt) podman exec "$node" pgrep -x dpkg >/dev/null 2>&1 ;;
        pip) podman exec "$node" sh -c "test -d $site/torch && ! test -e $site/torch-*.dist-info/RECORD" 2>/dev/null ;;
        *) echo "unknown phase $phase" >&2; exit 2 ;;
    esac
}

setsid ansible-playbook "$@" >"$log" 2>&1 &
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
        echo "the run ended (status $(wait "$pid"; echo $?)) before the $phase phase; log $log"
        unhold
        exit 1
    fi
    if (( SECONDS - start > 900 )); then
        kill_run
        unhold
        echo "the $phase phase was not reached in 900 s; log $log"
        exit 1
    fi
    sleep 0.5
done
kill_run
# Whatever the run ran on the node: the module (AnsiballZ) and the commands
# under it.
victims=$(podman exec "$node" pgrep -d ' ' -f 'AnsiballZ|ansible-tmp|/bin/pip|pip install|dpkg|apt-get|/usr/bin/apt' || true)
[ -n "$victims" ] && podman exec "$node" kill -KILL $victims 2>/dev/null
unhold
echo "$node: killed [${victims}] after $((SECONDS - start)) s in the $phase phase"
sleep 1
podman exec "$node" sh -c "
  echo dpkg audit: \$(dpkg --audit | head -3 | tr '\n' ' ')
  if test -x /opt/torchrig/venv/bin/python; then
    /opt/torchrig/venv/bin/python -c 'import torch' >/dev/null 2>&1 && echo import torch: ok || echo import torch: fails
  else echo venv: none; fi"
