#!/usr/bin/env bash
# Builds the root filesystem tarball of a local cluster node: Debian with
# systemd as PID 1, sshd and an admin user with passwordless sudo. No registry
# is needed: debootstrap fetches from a Debian mirror, podman imports the tar.
#
# usage: build-node-image.sh OUT.tar SUITE MIRROR PACKAGE,PACKAGE,... ADMIN_USER ZIP_BYTECODE.py
set -euo pipefail

out=$1 suite=$2 mirror=$3 include=$4 admin=$5 zip_bytecode=$6
work=$(mktemp -d /var/tmp/torchrig-rootfs.XXXXXX)
# The tarball is written under a name of this run's own and renamed: two
# builds at once (make image in two checkouts) each rename a complete file,
# and neither sees the other's half-written one. The name does not match
# node-*.tar, which image.yml removes as an older recipe's.
tmp=$(mktemp "$out.XXXXXX")
trap 'rm -rf "$work" "$tmp"' EXIT
root=$work/rootfs

debootstrap --variant=minbase --include="$include" "$suite" "$root" "$mirror"

# Each container must get its own identity at first boot: systemd fills an
# empty machine-id, and sshd's host keys are made by the drop-in below.
: > "$root/etc/machine-id"
rm -f "$root"/etc/ssh/ssh_host_*
mkdir -p "$root/etc/systemd/system/ssh.service.d"
cat > "$root/etc/systemd/system/ssh.service.d/torchrig-hostkeys.conf" <<'UNIT'
[Service]
ExecStartPre=
ExecStartPre=/usr/bin/ssh-keygen -A
ExecStartPre=/usr/sbin/sshd -t
UNIT
cat > "$root/etc/ssh/sshd_config.d/torchrig.conf" <<'SSHD'
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
SSHD

# Ansible logs in as an unprivileged admin and becomes root with sudo, as on
# a real cloud or bare-metal host.
chroot "$root" useradd --create-home --shell /bin/bash "$admin"
echo "$admin ALL=(ALL) NOPASSWD:ALL" > "$root/etc/sudoers.d/$admin"
chmod 0440 "$root/etc/sudoers.d/$admin"

# Every Ansible task's module arrives as a zip, whose imports Python compiles
# afresh each time: the system Python keeps root's compiled code instead (the
# module's docstring says how). The training venv does not read dist-packages.
install -m 0644 "$zip_bytecode" "$root/usr/lib/python3/dist-packages/torchrig_zip_bytecode.py"
echo 'import torchrig_zip_bytecode; torchrig_zip_bytecode.install()' > "$root/usr/lib/python3/dist-packages/torchrig_zip_bytecode.pth"

# Egress may pass a TLS-intercepting proxy: pip inside a node then needs the
# host's extra CA certificates.
if compgen -G "/usr/local/share/ca-certificates/*.crt" > /dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates > /dev/null
fi

# Keep the package lists: roles install with apt's cache_valid_time, which
# would otherwise skip the update and fail to find packages.
cp /etc/resolv.conf "$root/etc/resolv.conf"
chroot "$root" apt-get update -qq
chroot "$root" apt-get clean
: > "$root/etc/resolv.conf"

tar --numeric-owner -C "$root" -cf "$tmp" .
chmod 0644 "$tmp"
mv "$tmp" "$out"
