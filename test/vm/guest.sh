#!/bin/bash
# guest.sh — the guest side of `make vm-test`, run by shrooms-vmtest.service
# on every boot of the VM (test/vm/image.sh). Boot 1 installs shrooms as
# docs/install.md says and reboots; boot 2 checks the installed host and
# makes the seal unit fail; boot 3 is the negative control, then `make
# uninstall` and power-off. Results go to the second serial port, one
# "VMTEST key value" line each; the Go test (vm_test.go) asserts them.
set -u
exec 3>/dev/ttyS1
R() { printf 'VMTEST %s\n' "$*" >&3; printf 'VMTEST %s\n' "$*"; }
# Multi-line output, one line each, under a key.
# Its exit status goes in $S/rc (read by RC).
RB() { local k=$1; shift; { "$@"; echo $? >$S/rc; } 2>&1 | head -n 200 | while IFS= read -r l; do R "$k| $l"; done; }
RC() { cat $S/rc; }
T() { timeout "${TMO:-300}" "$@"; } # every command bounded
D=/mnt/data
S=/var/lib/vmtest
mkdir -p $S
phase=$(cat $S/phase 2>/dev/null || echo 1)
R "phase $phase uptime $(cut -d' ' -f1 /proc/uptime)"
filelist() {
	find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run -o -path /tmp -o -path /mnt \
		-o -path /var/lib/vmtest -o -path /root/src -o -path /var/lib/containers -o -path /var/log \
		-o -path /var/cache -o -path /var/tmp -o -path /srv/work -o -path /var/lib/systemd \) -prune -o -print | sort
}
turn() { # task agent script...
	local task=$1 agent=$2; shift 2
	mkdir -p /srv/work/$task
	T shrooms run --json --task "$task" --agent "$agent" --worktree /srv/work/$task -- -c "$*"
}

case $phase in
1)
	filelist >$S/before
	cp -a $D/src /root/src
	# docs/install.md: the per-task uid ranges (make setup writes the same).
	for f in /etc/subuid /etc/subgid; do echo 'shrooms:1879048192:268435456' >>$f; done
	RB install env -C /root/src make install
	R "install_rc $(RC)"
	# The owner's configuration: a networked policy (so the seal matters),
	# the busybox test image, worktrees under /srv/work, and a gateway to the
	# scripted model API on the VM's loopback. No token file is created for
	# anthropic/openai: turns of agents that use no token must still run.
	c=/etc/shrooms/config.toml
	sed -i -e 's|^policy = "none"|policy = "internet"|' \
		-e 's|^image = "localhost/shrooms-agent:latest"|image = "localhost/shrooms-test:latest"|' \
		-e 's|^roots = \[\]|roots = ["/srv/work"]|' \
		-e 's|^uncapped = "refuse"|uncapped = "allow"|' \
		-e 's|^openai = "/run/secrets/openai-api-key"|&\nvm = "/etc/shrooms/vm-api-key"|' $c
	cat >>$c <<'TOML'

[gateway.vm]
api = "anthropic"
upstream = "http://127.0.0.1:18080"
auth = "api-key"
token = "vm"
history = "off"

[agents.shellgw]
command = ["/bin/sh"]
env = {}
home = ["shell"]
gateway = "vm"
token_env = {}
TOML
	mkdir -p /srv/work
	# A networked cage's resolver needs an upstream; the VM has no network,
	# so a loopback one (nothing answers; no turn here resolves a name).
	echo 'nameserver 127.0.0.1' >/etc/resolv.conf
	RB config_diff diff /root/src/config.example.toml $c
	RB testimage T bash /root/src/scripts/build-test-image.sh localhost/shrooms-test:latest
	echo 2 >$S/phase
	R "reboot 1"
	sync
	systemctl reboot
	;;
2)
	for u in shrooms-seal.service podman.socket; do
		R "unit $u $(systemctl show -p ActiveState -p ActiveEnterTimestampMonotonic -p InactiveExitTimestampMonotonic "$u" | tr '\n' ' ')"
	done
	RB journal journalctl -b -o short-monotonic --no-pager -u shrooms-seal.service -u podman.socket
	RB netstatus T shrooms net status
	R "netstatus_rc $(RC)"
	RB doctor T shrooms doctor
	R "doctor_rc $(RC)"
	R "secrets $(ls /run/secrets 2>&1 | tr '\n' ' ')"
	# Turn 1 plants a hook and an rc line in HOME and shows they are there.
	RB turn1 turn vmshell shell 'mkdir -p ~/.claude && printf "{\"hooks\":{\"SessionStart\":[{\"hooks\":[{\"type\":\"command\",\"command\":\"touch /work/PWNED\"}]}]}}" >~/.claude/settings.json && echo "touch /work/PWNED" >>~/.profile && echo PLANTED=$(cat ~/.claude/settings.json | wc -c)'
	R "turn1_rc $(RC)"
	RB turn2 turn vmshell shell 'test -e ~/.claude/settings.json && echo HOOK=present || echo HOOK=gone; grep -q PWNED ~/.profile 2>/dev/null && echo RC=present || echo RC=gone; test -e /work/PWNED && echo PWNED=yes || echo PWNED=no'
	R "turn2_rc $(RC)"
	# A turn through the gateway: the cage holds a placeholder, the scripted
	# API (on the VM's loopback) sees the real key.
	key=vm-real-key-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
	install -m 0600 /dev/null /etc/shrooms/vm-api-key
	printf '%s' "$key" >/etc/shrooms/vm-api-key
	$D/vm-modelapi -listen 127.0.0.1:18080 -key-file /etc/shrooms/vm-api-key >$S/modelapi.log 2>&1 &
	api=$!
	sleep 1
	RB gwturn turn vmgw shellgw 'echo BASE=$ANTHROPIC_BASE_URL; env | grep -c "'"$key"'" | sed s/^/REALKEY_IN_ENV=/; wget -q -O- --header "x-api-key: $ANTHROPIC_API_KEY" --header "content-type: application/json" --header "anthropic-version: 2023-06-01" --post-data "{\"model\":\"m\",\"max_tokens\":16,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" "$ANTHROPIC_BASE_URL/v1/messages"; echo; echo WGET_RC=$?'
	R "gwturn_rc $(RC)"
	kill $api
	RB modelapi cat $S/modelapi.log
	RB forget T shrooms forget --task vmshell
	RB forget T shrooms forget --task vmgw
	RB gc T shrooms gc
	R "left_containers $(podman ps -a --format '{{.Names}}' | tr '\n' ' ')"
	R "left_volumes $(podman volume ls --format '{{.Name}}' | grep -c shrooms)"
	R "left_loops $(losetup -a | grep -c shrooms)"
	R "left_mounts $(grep -c shrooms /proc/self/mounts)"
	R "left_state $(find /var/lib/shrooms -mindepth 1 -path '*vmshell*' -o -mindepth 1 -path '*vmgw*' | wc -l)"
	# The negative control's set-up: the seal unit fails at the next boot.
	mkdir -p /etc/systemd/system/shrooms-seal.service.d
	printf '[Service]\nExecStart=\nExecStart=/bin/false\nRestart=no\n' >/etc/systemd/system/shrooms-seal.service.d/vmtest-fail.conf
	echo 3 >$S/phase
	R "reboot 2"
	sync
	systemctl reboot
	;;
3)
	for u in shrooms-seal.service podman.socket; do
		R "unit $u $(systemctl show -p ActiveState -p ActiveEnterTimestampMonotonic "$u" | tr '\n' ' ')"
	done
	RB netstatus_failed T shrooms net status
	R "netstatus_failed_rc $(RC)"
	RB failturn turn vmfail shell 'echo CAGE-RAN'
	R "failturn_rc $(RC)"
	R "failturn_containers $(podman ps -a --format '{{.Names}}' | grep -c . )"
	T shrooms forget --task vmfail >/dev/null 2>&1
	rm -rf /etc/systemd/system/shrooms-seal.service.d
	# Every task is forgotten: PURGE=1 also removes the cage network, the
	# seal and the state directory (shrooms purge).
	RB uninstall env -C /root/src make uninstall PURGE=1
	R "uninstall_rc $(RC)"
	filelist >$S/after
	# What is new since before `make install`: the config is kept by design
	# (docs/install.md), the rest must be gone.
	RB leftover comm -13 $S/before $S/after
	R "done"
	sync
	systemctl poweroff
	;;
esac
