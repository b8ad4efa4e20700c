#!/bin/sh
# Evaluates nix/module.nix against stub NixOS options (nix/tests/eval-stubs.nix)
# with nixpkgs' lib only, and prints the result as JSON. nixpkgs.lib is never
# part of this repository: fetch it elsewhere, e.g.
#   git clone --depth 1 https://github.com/nix-community/nixpkgs.lib /tmp/nixpkgs-lib
#   NIXPKGS_LIB=/tmp/nixpkgs-lib nix/eval-module.sh
# internal/nixcheck's TestModuleEvaluates runs this (SHROOMS_NIXPKGS_LIB).
set -eu
: "${NIXPKGS_LIB:?set NIXPKGS_LIB to a nixpkgs.lib checkout (the directory holding lib/)}"
lib=$NIXPKGS_LIB
if [ -d "$lib/lib" ]; then
	lib=$lib/lib
fi
case $lib in
/*) ;;
*) lib=$(pwd)/$lib ;;
esac
if [ ! -f "$lib/default.nix" ]; then
	echo "eval-module: $lib/default.nix not found: NIXPKGS_LIB must be a nixpkgs.lib checkout" >&2
	exit 1
fi
here=$(cd "$(dirname "$0")" && pwd)
exec nix-instantiate --eval --strict --json "$here/tests/eval-stubs.nix" --argstr libPath "$lib"
