#!/bin/bash
# The join of a node (join_start.yml): ansible-playbook ARGS, that is
# provision.yml --limit NODE, killed while dpkg runs on the node, then killed
# while pip unpacks torch there (kill_provision.sh), then run to the end: a
# node added to the cluster whose first runs crashed. Each run's output goes
# to DIR/join-apt.log, join-pip.log and join-final.log; prints what the kills
# did and the last run's status and time. The last run starts once DIR/join-go
# exists.
#   join.sh NODE DIR ARGS...
set -u
node=$1 dir=$2
shift 2
here=$(dirname "$0")
"$here/kill_provision.sh" apt "$dir/join-apt.log" "$node" "$@" || exit 1
"$here/kill_provision.sh" pip "$dir/join-pip.log" "$node" "$@" || exit 1
# The last run changes the trust and peers of the nodes already there: it
# waits for DIR/join-go, which the scenario makes once nothing it runs on
# them meanwhile expects them unchanged (the preview).
waited=$SECONDS
until [ -e "$dir/join-go" ]; do
    if (( SECONDS - waited > 1800 )); then echo "no $dir/join-go after 1800 s"; exit 1; fi
    sleep 1
done
start=$SECONDS
ansible-playbook "$@" > "$dir/join-final.log" 2>&1
rc=$?
echo "the last run: status $rc after $((SECONDS - start)) s"
exit "$rc"
