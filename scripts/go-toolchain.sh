#!/usr/bin/env bash
# go-toolchain.sh [DIR] — make sure a Go toolchain new enough for go.mod
# (>= 1.21, which fetches the exact toolchain go.mod names by itself) is at
# DIR/bin/go (default /usr/local/go). Debian 12 ships only Go 1.19, so when
# none is there, Debian's Go 1.19 downloads the toolchain as a module from
# the Go module proxy (golang.org/toolchain, checksum-verified) and it is
# unpacked into DIR. Idempotent.
set -euo pipefail
dest=${1:-/usr/local/go}
want=go1.24.13
have_ok() {
	local go=$1
	[ -x "$go" ] || return 1
	local v
	v=$("$go" env GOVERSION 2>/dev/null || true)
	[[ $v =~ ^go1\.([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 21 ]
}
if have_ok "$dest/bin/go"; then
	echo "go: $("$dest/bin/go" env GOVERSION) at $dest"
	exit 0
fi
if [ "$dest" = /usr/local/go ] && have_ok "$(command -v go || true)"; then
	echo "go: $(go env GOVERSION) on PATH"
	exit 0
fi
if [ ! -x /usr/lib/go-1.19/bin/go ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends golang-1.19-go ca-certificates
fi
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
arch=$(dpkg --print-architecture)
dir=$(cd "$tmp" && GOPATH="$tmp/gopath" GOFLAGS=-mod=mod GO111MODULE=on \
	/usr/lib/go-1.19/bin/go mod download -json "golang.org/toolchain@v0.0.1-$want.linux-$arch" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -n "$dir" ] && [ -f "$dir/bin/go" ] || { echo "go-toolchain: download of $want failed" >&2; exit 1; }
rm -rf "$dest.new"
cp -a "$dir" "$dest.new"
# Module zips carry no mode bits: restore what a Go distribution needs.
chmod -R u+w,a+rX "$dest.new"
chmod a+x "$dest.new"/bin/* "$dest.new"/pkg/tool/*/*
rm -rf "$dest"
mv "$dest.new" "$dest"
echo "go: installed $("$dest/bin/go" env GOVERSION) at $dest"
