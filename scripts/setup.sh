#!/usr/bin/env bash
# setup.sh — prepare a Debian 12 host (as root) for shrooms' test suite.
# This is the whole of `make setup`. It is idempotent: a second run installs
# nothing, rewrites nothing and takes a few seconds.
#
#   1. Debian packages (apt only when something is missing)
#   2. /etc/containers/containers.conf.d/50-shrooms-test.conf
#   3. /etc/subuid, /etc/subgid: `containers` (userns=auto) and `shrooms` ranges
#   4. the podman API service on unix:///run/shrooms-test/podman.sock
#   5. the test image localhost/shrooms-test:latest
#   6. a smoke test: one container through the service
#   7. the pinned upstream gVisor runsc (/var/cache/shrooms-runsc/<version>)
# No container registry is needed at any point.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "setup: $*" >&2; exit 1; }
ensured=()
ok() { ensured+=("$*"); }

[ "$(id -u)" = 0 ] || die "must run as root"
[ -r /etc/debian_version ] || die "expects a Debian host"

# ---------------------------------------------------------------- 1. packages
# netavark + aardvark-dns + iptables: podman 4.3's bridge networks (netavark
# 1.4 programs iptables). catatonit: --init. conmon: podman's monitor.
# runc is named explicitly so apt satisfies podman's "crun | runc" with runc
# (crun fails on hybrid cgroup hosts). systemd: systemd-analyze verifies the
# unit `make install` writes. zsh: the zsh completion test sources the
# generated script in a real zsh. tmux: the terminal tests drive `run --tty`
# (and interactive Claude Code) in a tmux server of their own, and hang it
# up. Recommends are not installed.
packages=(
	podman runc conmon netavark aardvark-dns iptables catatonit slirp4netns
	nftables uidmap busybox-static iproute2 git jq ca-certificates curl
	util-linux procps tar nix-bin systemd zsh tmux
)
# npm builds the agent image (scripts/build-agent-image.sh). Debian's npm
# package, unless a nodejs that ships its own npm (NodeSource) is there.
command -v npm >/dev/null || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
	if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != installed ]; then
		missing+=("$p")
	fi
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "setup: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends \
		-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
		"${missing[@]}"
	ok "packages: installed ${missing[*]}"
else
	ok "packages: all ${#packages[@]} present"
fi

# A Go toolchain new enough for go.mod (Debian 12 ships only 1.19).
ok "$(bash "$here/go-toolchain.sh")"

# The walk `make shape` counts (tools/walk) is a module of its own: its
# golang.org/x/tools goes into the module cache now, so that `make shape`
# works offline.
gobin=$(command -v go || echo /usr/local/go/bin/go)
(cd "$here/../tools/walk" && "$gobin" mod download) || die "tools/walk: go mod download failed"
ok "tools/walk: golang.org/x/tools in the module cache"

# ------------------------------------------------------- 2. containers.conf
# Podman 4.3 reads /etc/containers/containers.conf.d/*.conf after
# containers.conf (verified below with `podman info`).
# - runtime runc: crun fails on hybrid (v1 + unified) cgroup hosts.
# - cgroup_manager cgroupfs when systemd is not init (no systemd, no dbus).
# - events_logger file: no journald needed.
# - default_ulimits: rootful podman otherwise gives every container
#   nofile=nproc=1048576, above the host's hard limits; without
#   CAP_SYS_RESOURCE (these VMs drop it) runc then fails with "error setting
#   rlimit type 7: operation not permitted". The service applies these
#   defaults to API-created containers that set no rlimits, too.
if [ -d /run/systemd/system ] && [ "$(cat /proc/1/comm 2>/dev/null || true)" = systemd ]; then
	cgroup_manager=systemd
else
	cgroup_manager=cgroupfs
fi
conf_dir=/etc/containers/containers.conf.d
conf=$conf_dir/50-shrooms-test.conf
conf_text="# Written by shrooms scripts/setup.sh for the test suite; rewritten on every run.
[containers]
default_ulimits = [\"nofile=1024:1024\", \"nproc=1024:1024\"]

[engine]
runtime = \"runc\"
cgroup_manager = \"$cgroup_manager\"
events_logger = \"file\"
"
conf_changed=0
write_if_changed() { # path content
	if [ ! -f "$1" ] || [ "$(cat "$1")" != "$(printf '%s' "$2")" ]; then
		mkdir -p "$(dirname "$1")"
		printf '%s' "$2" >"$1.tmp.$$"
		chmod 0644 "$1.tmp.$$"
		mv -f "$1.tmp.$$" "$1"
		conf_changed=1
	fi
}
write_if_changed "$conf" "$conf_text"
conf_check() {
	[ "$(podman info --format '{{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}} {{.Host.EventLogger}}' 2>/dev/null)" = "runc $cgroup_manager file" ]
}
if ! conf_check; then
	# The drop-in was not honoured: fall back to the main file, but only when
	# it does not exist yet or is ours.
	main=/etc/containers/containers.conf
	if [ -f "$main" ] && ! head -n1 "$main" | grep -q 'shrooms scripts/setup.sh'; then
		die "podman ignores $conf and $main exists; merge this into it by hand:
$conf_text"
	fi
	rm -f "$conf"
	write_if_changed "$main" "$conf_text"
	conf_check || die "podman info does not report runtime runc / cgroup manager $cgroup_manager / events logger file after writing $main"
	ok "containers.conf: $main (runtime runc, cgroup_manager $cgroup_manager, events_logger file, default_ulimits)"
else
	ok "containers.conf: $conf (runtime runc, cgroup_manager $cgroup_manager, events_logger file, default_ulimits)"
fi

# ------------------------------------------------------- 3. subuid / subgid
# containers: podman's userns=auto pool. shrooms: explicit per-task uid maps,
# 4096 slots of 65536 ids. Neither may overlap the other or existing entries
# (useradd allocates below SUB_UID_MAX = 600100000).
CONTAINERS_RANGE=1073741824:536870912 # 0x40000000, 8192 x 65536
SHROOMS_RANGE=1879048192:268435456    # 0x70000000, 4096 x 65536
ensure_subid() { # file name start:count require-exact
	local file=$1 name=$2 want=$3 exact=$4 have start count
	touch "$file"
	have=$(awk -F: -v n="$name" '$1 == n { print $2 ":" $3; exit }' "$file")
	if [ -n "$have" ]; then
		if [ "$exact" = 1 ] && [ "$have" != "$want" ]; then
			die "$file has $name:$have, the tests expect $name:$want; fix the line by hand"
		fi
		echo "$name:$have"
		return 0
	fi
	start=${want%%:*} count=${want##*:}
	local clash
	clash=$(awk -F: -v s="$start" -v c="$count" '
		$1 !~ /^#/ && NF >= 3 && $2 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+$/ {
			if ($2 + 0 < s + c && s + 0 < $2 + $3) print $0
		}' "$file")
	[ -z "$clash" ] || die "$file: the range $name:$want overlaps: $clash"
	if [ -s "$file" ] && [ -n "$(tail -c1 "$file")" ]; then echo >>"$file"; fi
	echo "$name:$want" >>"$file"
	echo "$name:$want (added)"
}
for f in /etc/subuid /etc/subgid; do
	c=$(ensure_subid "$f" containers "$CONTAINERS_RANGE" 0)
	s=$(ensure_subid "$f" shrooms "$SHROOMS_RANGE" 1)
	ok "$f: $c, $s"
done
# The two ranges must not overlap each other either (an old containers line).
for f in /etc/subuid /etc/subgid; do
	awk -F: '
		$1 == "containers" { cs = $2; cc = $3 }
		$1 == "shrooms" { ss = $2; sc = $3 }
		END { if (cs != "" && ss != "" && cs + 0 < ss + sc && ss + 0 < cs + cc) exit 1 }
	' "$f" || die "$f: the containers and shrooms ranges overlap"
done

# ------------------------------------------------------- 4. podman service
if [ "$conf_changed" = 1 ] && bash "$here/podman-service.sh" status >/dev/null 2>&1; then
	# A running service would keep the old configuration.
	bash "$here/podman-service.sh" restart >/dev/null
fi
bash "$here/podman-service.sh" start >/dev/null
ok "podman service: unix:///run/shrooms-test/podman.sock answers _ping"

# ------------------------------------------------------- 5. test image
ok "test image: $(bash "$here/build-test-image.sh" localhost/shrooms-test:latest | sed 's/^build-test-image: //')"

# ------------------------------------------------------ 5b. agent image
# Debian + Claude Code + opencode from npm (test/agents); cached, idempotent.
ok "agent image: $(bash "$here/build-agent-image.sh" localhost/shrooms-agent:latest | sed 's/^build-agent-image: //')"

# ------------------------------------------------------- 6. smoke test
# One container through the service: proves the service, the image, runc and
# the default ulimits together.
smoke=$(podman --url unix:///run/shrooms-test/podman.sock run --rm --network none \
	localhost/shrooms-test:latest sh -c 'echo "$(id -u) $(ulimit -n)"' 2>&1) ||
	die "smoke test failed: $smoke"
[ "$smoke" = "0 1024" ] || die "smoke test: expected uid 0 and nofile 1024, got: $smoke"
ok "smoke test: podman --url ... run --rm localhost/shrooms-test works"

# ------------------------------------------------------------- 7. runsc
# The pinned upstream gVisor runsc, static, cached by version (the runsc
# suites of `make test`; docs/gvisor.md). A cold build takes ~7 min.
runsc=$(bash "$here/build-runsc.sh") || die "runsc build failed"
ok "runsc: $runsc ($("$runsc" --version 2>&1 | head -1))"

# ------------------------------------------------------------------- report
for line in "${ensured[@]}"; do
	echo "setup: ok $line"
done
