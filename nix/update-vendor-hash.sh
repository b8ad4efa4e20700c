#!/usr/bin/env bash
# update-vendor-hash.sh — recompute nix/package.nix's vendorHash (the NAR hash
# of `go mod vendor` for the package's own src, evaluated with nix-instantiate
# into a temporary chroot store, as buildGoModule computes it)
# and write it in place. Needs go and nix (Debian: apt-get install nix-bin).
# Run it after changing go.mod, go.sum or the set of imported packages; the
# test internal/nixcheck TestVendorHash fails until you do.
set -euo pipefail
cd "$(dirname "$0")/.."
SHROOMS_UPDATE_VENDOR_HASH=1 go test -count=1 -run '^TestVendorHash$' -v ./internal/nixcheck/ | grep -E 'vendorHash|^(ok|FAIL|---)' || true
grep -n 'vendorHash = ' nix/package.nix
