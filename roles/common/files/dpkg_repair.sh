#!/bin/sh
# dpkg_repair.sh: run wherever `dpkg --audit` reported something. Packages
# whose unpacking was killed (status half-installed, or flagged
# reinstall-required) are left so by `dpkg --configure --pending`, which may
# even exit 0: install those packages' .deb again from apt's sources (the environment's
# APT_CONFIG: the cluster's repository) and finish dpkg's pending work.
# Prints the packages it reinstalled; fails with dpkg's or apt's message.
set -eu
broken=$(dpkg-query -W -f='${db:Status-Abbrev} ${binary:Package}\n' |
  awk 'substr($1, 2, 1) ~ /[HF]/ || substr($1, 3, 1) == "R" { print $2 }')
if [ -n "$broken" ]; then
  # shellcheck disable=SC2086 # one argument per package
  apt-get install -y -q --reinstall -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold $broken
fi
dpkg --configure --pending --force-confdef --force-confold
echo "reinstalled: ${broken:-nothing}"
