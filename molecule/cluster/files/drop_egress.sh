#!/bin/sh
# Runs on a node: from now on, and after every boot, the node reaches only its
# own networks' other hosts (its peers). New connections to anything else are
# dropped: the internet, the Debian mirror, PyPI, and the controller itself
# (each network's gateway is the machine that runs the containers); only
# replies to connections the controller opens (Ansible's SSH) pass. As on a
# cluster whose nodes have no egress.
set -eu
nets=$(ip -o -4 addr show scope global | awk '{print $4}' | sed 's#\.[0-9]*/24$#.0/24#' | sort -u | paste -sd, -)
gateways=$(echo "$nets" | tr , '\n' | sed 's#\.0/24$#.1#' | paste -sd, -)
cat > /etc/torchrig-test-egress.nft <<NFT
# Written by molecule/cluster/files/drop_egress.sh (a test fixture).
table inet torchrig_test_egress
delete table inet torchrig_test_egress
table inet torchrig_test_egress {
	chain output {
		type filter hook output priority filter; policy drop;
		oif "lo" accept
		ct state established,related accept
		ip daddr { $gateways } counter drop comment "the controller and the way out"
		ip daddr { $nets } accept comment "peers"
		counter comment "everything else"
	}
}
NFT
cat > /etc/systemd/system/torchrig-test-egress.service <<UNIT
[Unit]
Description=Drop traffic to anything outside the cluster (torchrig test fixture)
DefaultDependencies=no
# After nftables.service: Debian's /etc/nftables.conf, which it loads (the
# firewall role enables it), begins with "flush ruleset"; run first, this
# table was flushed at boot now and then (CI, after the faults' restarts).
After=nftables.service
Before=network-pre.target
Wants=network-pre.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/nft -f /etc/torchrig-test-egress.nft

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now torchrig-test-egress.service
nft list table inet torchrig_test_egress >/dev/null
echo "peers: $nets; dropped: $gateways and everything else"
