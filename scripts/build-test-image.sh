#!/usr/bin/env bash
# build-test-image.sh — build the tiny busybox test image without a registry.
#
#   scripts/build-test-image.sh [IMAGE]     (default localhost/shrooms-test:latest)
#   SHROOMS_TEST_IMAGE_FORCE=1 scripts/build-test-image.sh   rebuild regardless
#
# The rootfs is /bin/busybox (from Debian's busybox-static) plus one relative
# symlink per applet, an /etc/passwd with root and agent (1000:1000,
# /home/agent, /bin/sh), the directories a cage mounts over, and placeholder
# /etc/hosts, /etc/hostname and /etc/resolv.conf (podman bind-mounts its own
# over them; a read-only rootfs cannot grow the mount points).
# It is packed as a reproducible tar and `podman import`ed with CMD
# ["/bin/sh"] and the label io.shrooms.test.inputs = sha256 of this script and
# the busybox binary. When an image with that label value already exists,
# nothing is done.
set -euo pipefail

IMAGE=${1:-localhost/shrooms-test:latest}
LABEL=io.shrooms.test.inputs
BUSYBOX=/bin/busybox

die() { echo "build-test-image: $*" >&2; exit 1; }

# Debian's busybox-static installs /bin/busybox; a dynamically linked busybox
# would not run in an image without a libc.
[ -x "$BUSYBOX" ] || die "no $BUSYBOX (apt-get install busybox-static)"
ldd_out=$(LC_ALL=C ldd "$BUSYBOX" 2>&1 || true)
if [[ $ldd_out != *"not a dynamic executable"* && $ldd_out != *"statically linked"* ]]; then
	die "$BUSYBOX is dynamically linked; install busybox-static"
fi

self=$(readlink -f "${BASH_SOURCE[0]}")
inputs=$( { sha256sum "$self" | cut -d' ' -f1; sha256sum "$BUSYBOX" | cut -d' ' -f1; } | sha256sum | cut -d' ' -f1)

if [ "${SHROOMS_TEST_IMAGE_FORCE:-0}" != 1 ]; then
	have=$(podman image inspect --format "{{index .Labels \"$LABEL\"}}" "$IMAGE" 2>/dev/null || true)
	if [ "$have" = "$inputs" ]; then
		echo "build-test-image: $IMAGE is up to date (inputs ${inputs:0:12})"
		exit 0
	fi
fi
old_id=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)

work=$(mktemp -d /var/tmp/shrooms-test-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root"
cd "$root"

mkdir -p bin etc home/agent work outbox tmp var/tmp run proc sys dev root usr
ln -s bin sbin
ln -s ../bin usr/bin
ln -s ../bin usr/sbin
cp "$BUSYBOX" bin/busybox
chmod 0755 bin/busybox
for applet in $("$BUSYBOX" --list); do
	case $applet in busybox | */*) continue ;; esac
	ln -s busybox "bin/$applet"
done

cat >etc/passwd <<'EOF'
root:x:0:0:root:/root:/bin/sh
agent:x:1000:1000:agent:/home/agent:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >etc/group <<'EOF'
root:x:0:
agent:x:1000:
nogroup:x:65534:
EOF
: >etc/hosts
: >etc/hostname
: >etc/resolv.conf
chmod 0644 etc/passwd etc/group etc/hosts etc/hostname etc/resolv.conf
chmod 0700 root
chmod 1777 tmp var/tmp
chmod 0755 home work outbox run proc sys dev
chown -R 0:0 .
chown 1000:1000 home/agent
chmod 0755 home/agent

tar --sort=name --mtime=@0 --numeric-owner --format=gnu -C "$root" -cf "$work/rootfs.tar" .

podman import \
	--change 'CMD ["/bin/sh"]' \
	--change "LABEL $LABEL=$inputs" \
	--quiet --message "shrooms test image (busybox-static)" \
	"$work/rootfs.tar" "$IMAGE" >/dev/null

new_id=$(podman image inspect --format '{{.Id}}' "$IMAGE")
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
	# The superseded image is untagged now; drop it unless a container uses it.
	podman image rm "$old_id" >/dev/null 2>&1 || true
fi
echo "build-test-image: imported $IMAGE ${new_id:0:12} (inputs ${inputs:0:12})"
