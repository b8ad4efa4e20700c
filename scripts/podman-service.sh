#!/usr/bin/env bash
# podman-service.sh — the podman API service the test suite talks to.
#
#   scripts/podman-service.sh [start]   start it unless the socket already answers
#   scripts/podman-service.sh stop      stop the service this script started
#   scripts/podman-service.sh restart   stop, then start
#   scripts/podman-service.sh status    exit 0 if the socket answers _ping
#
# The service listens on unix://$SHROOMS_TEST_RUN/podman.sock (default
# /run/shrooms-test/podman.sock), logs to podman-service.log and records its
# pid in podman-service.pid in the same directory. It is started with a clean
# environment in its own session (setsid + nohup), so it outlives the caller
# and does not inherit XDG_RUNTIME_DIR, DBUS_SESSION_BUS_ADDRESS, NOTIFY_SOCKET
# or CONTAINERS_* overrides from it.
#
# It must run in the host's root network namespace with the normal cgroup
# mounts: a service started under `ip netns exec` (which remounts /sys and
# so hides /sys/fs/cgroup) would put every cage in the wrong namespace and
# fail to create cgroups. The script refuses to start it from there.
set -euo pipefail

RUN_DIR=${SHROOMS_TEST_RUN:-/run/shrooms-test}
SOCK=$RUN_DIR/podman.sock
LOG=$RUN_DIR/podman-service.log
PIDFILE=$RUN_DIR/podman-service.pid
LOG_LEVEL=${SHROOMS_PODMAN_LOG_LEVEL:-info}
WAIT_SECONDS=${SHROOMS_PODMAN_WAIT:-20}

die() { echo "podman-service: $*" >&2; exit 1; }

ping_ok() {
	[ -S "$SOCK" ] || return 1
	[ "$(curl -sS --max-time 3 --unix-socket "$SOCK" http://d/_ping 2>/dev/null)" = OK ]
}

# our_pid prints the pid from the pid file if that process is alive and is a
# `podman system service` on our socket (never trust a recycled pid).
our_pid() {
	local pid cmd
	[ -r "$PIDFILE" ] || return 1
	pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	[ -r "/proc/$pid/cmdline" ] || return 1
	cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
	case $cmd in
	*podman*" system service "*"unix://$SOCK"*) echo "$pid" ;;
	*) return 1 ;;
	esac
}

check_namespaces() {
	# Named network namespaces (ip netns add/exec, used by the test bed).
	local ns
	ns=$(ip netns identify $$ 2>/dev/null || true)
	if [ -n "$ns" ]; then
		die "refusing to start: this shell is in network namespace '$ns'; run from the host's root network namespace"
	fi
	# When PID 1's namespaces are readable, compare with them directly.
	local t mine init
	for t in net mnt; do
		mine=$(readlink "/proc/self/ns/$t" 2>/dev/null || true)
		init=$(readlink "/proc/1/ns/$t" 2>/dev/null || true)
		if [ -n "$init" ] && [ -n "$mine" ] && [ "$mine" != "$init" ]; then
			die "refusing to start: $t namespace $mine is not PID 1's ($init); run from the host namespaces (e.g. nsenter -t 1 -m -n $0 start)"
		fi
	done
	if ! grep -qE '^[^ ]+ /sys/fs/cgroup(/[^ ]*)? cgroup2? ' /proc/self/mounts; then
		die "refusing to start: no cgroup filesystem is mounted under /sys/fs/cgroup in this mount namespace"
	fi
}

start() {
	if ping_ok; then
		echo "podman-service: already answering on unix://$SOCK"
		return 0
	fi
	local pid
	if pid=$(our_pid); then
		# Started earlier but not answering (yet): give it the same grace period.
		echo "podman-service: pid $pid exists but does not answer yet; waiting"
	else
		check_namespaces
		command -v podman >/dev/null || die "podman is not installed (run scripts/setup.sh)"
		mkdir -p "$RUN_DIR"
		chmod 0711 "$RUN_DIR"
		rm -f "$SOCK" "$PIDFILE"
		{ echo; echo "=== $(date -Is) starting podman system service (log level $LOG_LEVEL)"; } >>"$LOG"
		# The inner shell writes its own pid, then execs podman: the pid file
		# names the podman process itself.
		setsid nohup env -i \
			PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
			HOME=/root LANG=C.UTF-8 \
			/bin/sh -c 'echo $$ >"$1"; shift; exec "$@"' sh "$PIDFILE" \
			podman --log-level="$LOG_LEVEL" system service --time=0 "unix://$SOCK" \
			</dev/null >>"$LOG" 2>&1 &
		disown || true
	fi
	local deadline=$((SECONDS + WAIT_SECONDS))
	while [ $SECONDS -lt $deadline ]; do
		if ping_ok; then
			echo "podman-service: answering on unix://$SOCK (pid $(cat "$PIDFILE" 2>/dev/null || echo '?'))"
			return 0
		fi
		if [ -r "$PIDFILE" ] && ! our_pid >/dev/null; then
			break # it died
		fi
		sleep 0.2
	done
	echo "podman-service: the service did not answer on unix://$SOCK within ${WAIT_SECONDS}s; last lines of $LOG:" >&2
	tail -n 20 "$LOG" >&2 || true
	exit 1
}

stop() {
	local pid i
	if ! pid=$(our_pid); then
		if ping_ok; then
			die "unix://$SOCK answers but was not started by this script (no valid $PIDFILE); not stopping it"
		fi
		rm -f "$PIDFILE"
		echo "podman-service: not running"
		return 0
	fi
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq 1 50); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.2
	done
	if kill -0 "$pid" 2>/dev/null; then
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$PIDFILE" "$SOCK"
	echo "podman-service: stopped pid $pid"
}

case ${1:-start} in
start) start ;;
stop) stop ;;
restart) stop; start ;;
status)
	if ping_ok; then echo "podman-service: answering on unix://$SOCK"; else echo "podman-service: not answering on unix://$SOCK"; exit 1; fi
	;;
*) die "usage: $0 [start|stop|restart|status]" ;;
esac
