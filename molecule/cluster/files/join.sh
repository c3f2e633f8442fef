#!/bin/bash
# The join of a node (join_start.yml): ansible-playbook ARGS, that is
# provision.yml --limit NODE, killed while dpkg runs on the node, then killed
# while pip unpacks torch there (kill_provision.sh), then run to the end: a
# node added to the cluster whose first runs crashed. Each run's output goes
# to DIR/join-apt.log, join-pip.log and join-final.log; prints what the kills
# did and the last run's status and time.
#   join.sh NODE DIR ARGS...
set -u
node=$1 dir=$2
shift 2
here=$(dirname "$0")
"$here/kill_provision.sh" apt "$dir/join-apt.log" "$node" "$@" || exit 1
"$here/kill_provision.sh" pip "$dir/join-pip.log" "$node" "$@" || exit 1
start=$SECONDS
ansible-playbook "$@" > "$dir/join-final.log" 2>&1
rc=$?
echo "the last run: status $rc after $((SECONDS - start)) s"
exit "$rc"
