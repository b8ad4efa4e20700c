#!/usr/bin/env bash
# image.sh — build (once) the Debian 12 VM image `make vm-test` boots.
#
#   test/vm/image.sh CACHE_DIR     prints the directory holding root.img,
#                                  vmlinuz and initrd.img
#
# mmdebstrap (apt-based, parallel downloads) writes a Debian 12 root with
# systemd, podman, runc, netavark, nftables, iptables, make and
# busybox-static (the cages' test image is built from it in the VM), and the
# kernel and initrd of Debian's own linux-image package, which qemu boots
# with -kernel/-initrd (no bootloader). `mkfs.ext4 -d` turns the root into a
# disk image without a loop mount. The image holds nothing of shrooms: the
# repository's build comes in on a second disk, so a code change reuses it.
# Cached under CACHE_DIR/<key>, key = sha256 of this script (its package
# list) and the mirror; older keys are removed.
set -euo pipefail
CACHE=${1:?usage: image.sh CACHE_DIR}
SUITE=bookworm
# Only what the test needs: no recommends. iptables: netavark programs it.
DEBS=linux-image-amd64,initramfs-tools,systemd,systemd-sysv,udev,dbus,kmod,podman,runc,conmon,netavark,aardvark-dns,iptables,nftables,uidmap,e2fsprogs,make,git,busybox-static,procps,iproute2,util-linux,ca-certificates
die() { echo "vm image: $*" >&2; exit 1; }
log() { echo "vm image: $*" >&2; }

mirror() {
	local f
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) { print $i; exit } }' "$f"
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\/.*\/debian\/?$/) { print $i; exit } }' "$f"
	done
}
MIRROR=${SHROOMS_DEBIAN_MIRROR:-$(mirror | head -n1)}
[ -n "$MIRROR" ] || die "found no Debian mirror in /etc/apt/sources.list{,.d}; set SHROOMS_DEBIAN_MIRROR"

self=$(readlink -f "${BASH_SOURCE[0]}")
key=$(printf '%s\n' "$(sha256sum "$self" | cut -d' ' -f1)" "$SUITE" "$DEBS" "$MIRROR" | sha256sum | cut -c1-16)
out=$CACHE/$key
if [ -f "$out/done" ]; then
	log "cached ($out)"
	echo "$out"
	exit 0
fi
mkdir -p "$CACHE"
chmod 0700 "$CACHE"
find "$CACHE" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf --one-file-system {} +
work=$(mktemp -d /var/tmp/shrooms-vm-image.XXXXXX)
cleanup() {
	awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/self/mounts | sort -r |
		while read -r m; do umount -l "$m" 2>/dev/null || true; done
	rm -rf --one-file-system "$work"
}
trap cleanup EXIT
root=$work/root
start=$(date +%s)
log "mmdebstrap $SUITE from $MIRROR"
mmdebstrap --mode=root --variant=minbase --include="$DEBS" \
	--aptopt='Acquire::Queue-Mode "host"' \
	--essential-hook='mkdir -p "$1/etc/initramfs-tools/conf.d"; echo MODULES=list >"$1/etc/initramfs-tools/conf.d/vm"; printf "%s\n" virtio_pci virtio_blk ext4 >"$1/etc/initramfs-tools/modules"' \
	"$SUITE" "$root" "$MIRROR" >"$work/mmdebstrap.log" 2>&1 || {
	cp "$work/mmdebstrap.log" "$CACHE/mmdebstrap-failed.log"; grep -E "^E:|rror|dpkg:" "$work/mmdebstrap.log" | tail -n 30 >&2
	die "mmdebstrap failed (log above)"
}
log "mmdebstrap took $(($(date +%s) - start)) s"

# The initrd (MODULES=list, set before the kernel was installed) holds only
# the virtio disk and ext4 drivers: small, and quick to unpack under TCG.
kver=$(ls "$root/lib/modules" | head -n1)

echo vmtest >"$root/etc/hostname"
printf '127.0.0.1 localhost vmtest\n::1 localhost\n' >"$root/etc/hosts"
printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' >"$root/etc/fstab"
: >"$root/etc/resolv.conf"
echo 'root::0:0:99999:7:::' >/dev/null # root stays locked: nobody logs in
# The test: the data disk's guest.sh, run once systemd is up, on every boot.
cat >"$root/etc/systemd/system/shrooms-vmtest.service" <<'UNIT'
[Unit]
Description=shrooms make vm-test: the guest side
After=multi-user.target
[Service]
Type=oneshot
ExecStartPre=/bin/mkdir -p /mnt/data
ExecStartPre=/bin/mount -o ro /dev/vdb /mnt/data
ExecStart=/bin/bash /mnt/data/guest.sh
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity
[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/shrooms-vmtest.service "$root/etc/systemd/system/multi-user.target.wants/shrooms-vmtest.service"
# Nothing that slows a TCG boot and the test does not use.
for u in podman-auto-update.timer apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer man-db.timer dpkg-db-backup.timer; do
	rm -f "$root/etc/systemd/system/timers.target.wants/$u"
done
ln -sf /dev/null "$root/etc/systemd/system/getty@tty1.service"
ln -sf /dev/null "$root/etc/systemd/system/serial-getty@ttyS0.service"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/*

mkdir -p "$out.tmp"
cp "$root/boot/vmlinuz-$kver" "$out.tmp/vmlinuz"
cp "$root/boot/initrd.img-$kver" "$out.tmp/initrd.img"
size=$(($(du -sm "$root" | cut -f1) + 3072))
mkfs.ext4 -q -F -L vmroot -d "$root" "$out.tmp/root.img" "${size}M"
rm -rf "$out"
mv "$out.tmp" "$out"
touch "$out/done"
log "built $out in $(($(date +%s) - start)) s (root $(du -sh --apparent-size "$out/root.img" | cut -f1), kernel $kver)"
echo "$out"
