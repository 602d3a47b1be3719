#!/usr/bin/env bash
# Build (once per machine) the cgroup v2 test VM's image from Debian's packages only: a bookworm rootfs made by
# mmdebstrap with Debian's own kernel (linux-image-amd64) in it, its vmlinuz + initrd taken out for qemu's -kernel,
# and the rootfs packed into an ext4 image (mke2fs -d, no loop mount). The guest has no Python of its own: the
# host's interpreter and the checkout (with its .venv) are shared into it read-only by 9p at the same paths, so
# the image holds only what they link against and what the process backend runs (bubblewrap, tini, util-linux,
# iproute2). The initrd holds only what finds the root (virtio, ext4): it boots faster than Debian's default.
# Usage: build-image.sh CACHE_DIR; the result is CACHE_DIR/{vmlinuz,initrd.img,rootfs.img}.
set -euo pipefail
out=${1:?usage: build-image.sh CACHE_DIR}
here=$(cd "$(dirname "$0")" && pwd)
command -v mmdebstrap >/dev/null || {
	echo "installing system packages: mmdebstrap"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		mmdebstrap e2fsprogs >/dev/null; }
pkgs=linux-image-amd64,kmod,bubblewrap,tini,util-linux,iproute2,procps,psmisc
# what the host's Python (pyenv, /root/.pyenv/versions/3.11.7) and the venv's wheels link against
pkgs=$pkgs,libbz2-1.0,libcom-err2,libcrypt1,libexpat1,libkeyutils1,liblzma5,libncursesw6,libreadline8,libtinfo6
pkgs=$pkgs,libtirpc3,zlib1g,libssl3,libsqlite3-0,libffi8,libgdbm6,libuuid1,libstdc++6,ca-certificates
tmp=$(mktemp -d /var/tmp/sandfleet-vm-build.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/root"
mmdebstrap --variant=minbase --include="$pkgs" \
	--customize-hook='echo sandfleet-vm > "$1/etc/hostname"' \
	--customize-hook="upload $here/guest-init /sbin/sandfleet-vm-init" \
	--customize-hook='chmod 0755 "$1/sbin/sandfleet-vm-init"' \
	--customize-hook='mkdir -p "$1/vmout"' \
	--customize-hook='printf "MODULES=list\n" > "$1/etc/initramfs-tools/conf.d/sandfleet-vm"' \
	--customize-hook='printf "virtio_pci\nvirtio_blk\next4\n" >> "$1/etc/initramfs-tools/modules"' \
	--customize-hook='chroot "$1" update-initramfs -u -k all' \
	bookworm "$tmp/root" >"$tmp/mmdebstrap.log" 2>&1 || { tail -30 "$tmp/mmdebstrap.log"; exit 1; }
cp "$(ls "$tmp"/root/boot/vmlinuz-* | head -1)" "$tmp/vmlinuz"
cp "$(ls "$tmp"/root/boot/initrd.img-* | head -1)" "$tmp/initrd.img"
rm -rf "$tmp"/root/boot/initrd.img-* "$tmp"/root/var/cache/apt/archives/*.deb
mke2fs -q -t ext4 -L sfvm-root -d "$tmp/root" "$tmp/rootfs.img" 2G
mkdir -p "$out"
mv "$tmp/vmlinuz" "$tmp/initrd.img" "$tmp/rootfs.img" "$out/"
echo "built $out: $(du -sh "$out" | cut -f1) (kernel $(basename "$(ls "$tmp"/root/boot/vmlinuz-* | head -1)"))"
