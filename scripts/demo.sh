#!/usr/bin/env bash
# demo.sh — one turn in a sealed cage, as `make demo` runs it: the cage prints
# who it is, what it may do, and tries a few things it may not.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d /tmp/shrooms-demo.XXXXXX)
# Forget the demo task (its HOME filesystem and outbox are mounts) first.
trap '"$here/bin/shrooms" --config "$work/config.toml" forget --task demo >/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/worktree"
cat > "$work/config.toml" <<TOML
[podman]
socket = "unix:///run/shrooms-test/podman.sock"
[state]
dir = "$work/state"
[cage]
image = "localhost/shrooms-test:latest"
memory = "256m"
[network]
policy = "none"
[outbox]
root = "$work/outbox"
[worktree]
roots = ["$work"]   # the demo's worktree is a plain directory, not a git work tree
TOML
"$here/bin/shrooms" --config "$work/config.toml" run --task demo --agent shell \
	--worktree "$work/worktree" -- -c '
echo "== inside the cage: $(id)"
grep -E "^(CapEff|NoNewPrivs|Seccomp):" /proc/self/status
echo "uid_map: $(cat /proc/self/uid_map)"
touch /etc/x 2>&1 || true
touch /usr/x 2>&1 || true
echo "result" > /work/result.txt && echo "wrote /work/result.txt"
'
echo "== back on the host: $(cat "$work/worktree/result.txt")"
