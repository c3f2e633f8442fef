#!/usr/bin/env bash
# molecule/shared/run-scenarios.sh JOBS NAME...: run-scenario.sh for each NAME,
# JOBS at a time. The role scenarios are independent (each has its own
# containers, networks and ephemeral directory, and the stand-in repository's
# server takes a free port), and on 2 cores two of them take about the time
# of one plus a third: most of a scenario's time is spent waiting on SSH and
# apt. Each scenario's output is printed whole when it ends, so outputs never
# interleave; the exit status is nonzero when any failed.
set -uo pipefail
jobs=$1
shift
[ "$#" -gt 0 ] || exit 0
logs=$(mktemp -d)
export logs
run_one() {
  .ci/stage "molecule $1" molecule/shared/run-scenario.sh "$1" > "$logs/$1.log" 2>&1
  local rc=$?
  cat "$logs/$1.log"
  echo "=== molecule $1: exit status $rc"
  return "$rc"
}
export -f run_one
printf '%s\n' "$@" | xargs -r -P "$jobs" -I{} bash -c 'run_one "$1"' _ {}
rc=$?
rm -rf "$logs"
exit "$rc"
