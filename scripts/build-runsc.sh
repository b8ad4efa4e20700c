#!/usr/bin/env bash
# build-runsc.sh — the pinned upstream gVisor runsc (docs/gvisor.md), built
# from the Go module proxy, static (CGO_ENABLED=0: a dynamic runsc cannot
# re-execute itself in the sandbox's empty chroot), with its version stamped
# in (upstream's build leaves VERSION_MISSING). Cached by version in
# $RUNSC_CACHE/<version>/runsc, root-owned and not group/other writable, as a
# cage.runtime path must be: a second run builds nothing. Prints the path.
set -euo pipefail

version=${RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}
cache=${RUNSC_CACHE:-/var/cache/shrooms-runsc}
dest=$cache/$version/runsc

die() { echo "build-runsc: $*" >&2; exit 1; }

# --path: where the pinned runsc is (built or not), for the Makefile.
if [ "${1:-}" = --path ]; then
	echo "$dest"
	exit 0
fi

if [ -x "$dest" ] && "$dest" --version 2>/dev/null | grep -qx "runsc version $version"; then
	echo "$dest"
	exit 0
fi

export PATH=/usr/local/go/bin:$PATH
command -v go >/dev/null || die "no go toolchain (scripts/go-toolchain.sh)"
install -d -m 0755 -o root -g root "$cache" "$cache/$version"
tmp=$(mktemp -d "$cache/$version/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOBIN="$tmp" go install -trimpath \
	-ldflags="-s -w -X gvisor.dev/gvisor/runsc/version.version=$version" \
	"gvisor.dev/gvisor/runsc@$version" >&2 || die "go install gvisor.dev/gvisor/runsc@$version failed"
got=$("$tmp/runsc" --version 2>&1 | head -1)
[ "$got" = "runsc version $version" ] || die "built runsc says '$got', not 'runsc version $version'"
# Static, or it never starts a sandbox.
go version -m "$tmp/runsc" | grep -q 'CGO_ENABLED=0' || die "built runsc is not static (CGO_ENABLED=0)"
chown root:root "$tmp/runsc"
chmod 0755 "$tmp/runsc"
mv -f "$tmp/runsc" "$dest"
echo "build-runsc: built $version in $(($(date +%s) - start))s" >&2
echo "$dest"
