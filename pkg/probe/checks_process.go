package probe

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// sandboxedRW are the mount points a cage may have writable: its tmpfs, the
// worktree, HOME, the outbox and the kernel's own pseudo filesystems.
var sandboxedRW = []string{"/tmp", "/run", "/work", "/home/agent", "/outbox", "/dev", "/dev/shm", "/dev/pts", "/dev/mqueue", "/proc", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/run/.containerenv"}

func underAny(p string, roots []string) bool {
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, strings.TrimSuffix(r, "/")+"/") {
			return true
		}
	}
	return false
}

func processChecks() []check {
	return []check{
		{"A1", "capabilities", "parse Cap{Inh,Prm,Eff,Bnd,Amb} in /proc/self/status", checkCaps},
		{"A2", "no_new_privs / setuid", "read NoNewPrivs; list setuid/setgid binaries", checkNNP},
		{"A3", "seccomp on every thread", "Seccomp of /proc/self/task/*/status; bad-argument calls (unshare, mount, keyctl, bpf, perf_event_open, userfaultfd, io_uring_setup, clone3, ptrace, TIOCSTI)", checkSeccomp},
		{"A4", "LSM confinement", "read /proc/self/attr/current", checkLSM},
		{"A5", "user namespace", "read /proc/self/{uid,gid}_map", checkUserNS},
		{"A6", "no host namespaces", "namespace inodes, PID 1, process count, host paths in /proc/net/unix", checkHostNS},
		{"A7", "read-only rootfs", "create files in / /etc /usr /var /opt /bin; list rw mounts", checkReadOnly},
	}
}

func checkCaps(_ context.Context, _ Params, c *Check) {
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		c.Verdict, c.Reason = Error, "read /proc/self/status: "+err.Error()
		return
	}
	var obs []string
	for _, f := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		v := statusField(string(st), f)
		obs = append(obs, f+"="+v)
		if n, err := strconv.ParseUint(v, 16, 64); err != nil || n != 0 {
			c.escape("%s=%s is not empty", f, v)
		}
	}
	c.Observed = strings.Join(obs, " ")
	c.settle(Sealed, "")
}

func checkNNP(_ context.Context, _ Params, c *Check) {
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		c.Verdict, c.Reason = Error, err.Error()
		return
	}
	nnp := statusField(string(st), "NoNewPrivs")
	c.Observed = "NoNewPrivs=" + nnp
	if nnp != "1" {
		c.escape("no_new_privs is %q: setuid binaries and file caps would raise privileges", nnp)
	}
	var suid []string
	for _, d := range []string{"/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/lib"} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() && fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
				suid = append(suid, filepath.Join(d, e.Name()))
			}
		}
	}
	c.ev("setuid/setgid binaries: %d %v (inert under no_new_privs)", len(suid), suid)
	c.settle(Sealed, "")
}

// A syscall tried with bad arguments: allowed means the kernel looked at the
// arguments (EBADF, EFAULT, EINVAL...), blocked means EPERM/ENOSYS.
type badCall struct {
	name string
	// must: every acceptable profile denies it (escape when allowed);
	// otherwise only shrooms' strict profile does (residual under podman's).
	must bool
	// tty: harmless while no terminal is reachable (podman's profile lets
	// TIOCSTI through; shrooms' denies it by its low 32 bits).
	tty  bool
	call func() error
}

func badCalls() []badCall {
	sc := func(trap uintptr, a ...uintptr) func() error {
		return func() error {
			var args [6]uintptr
			copy(args[:], a)
			_, _, e := unix.Syscall6(trap, args[0], args[1], args[2], args[3], args[4], args[5])
			if e != 0 {
				return e
			}
			return nil
		}
	}
	bad := ^uintptr(0) // -1 as a file descriptor
	return []badCall{
		// A multi-threaded process gets EINVAL from unshare(CLONE_NEWUSER)
		// when seccomp lets the call through: a safe way to ask.
		{"unshare(CLONE_NEWUSER)", false, false, sc(unix.SYS_UNSHARE, unix.CLONE_NEWUSER)},
		{"clone3(NULL)", false, false, sc(unix.SYS_CLONE3, 0, 0)},
		{"keyctl(-1)", false, false, sc(unix.SYS_KEYCTL, bad)},
		{"add_key(NULL)", false, false, sc(unix.SYS_ADD_KEY, 0, 0, 0, 0, 0)},
		{"request_key(NULL)", false, false, sc(unix.SYS_REQUEST_KEY, 0, 0, 0, 0)},
		{"ioctl(-1, TIOCSTI)", false, true, sc(unix.SYS_IOCTL, bad, unix.TIOCSTI, 0)},
		{"ioctl(-1, TIOCSTI|1<<32)", false, true, sc(unix.SYS_IOCTL, bad, 1<<32|unix.TIOCSTI, 0)},
		{"io_uring_setup(0, NULL)", false, false, sc(unix.SYS_IO_URING_SETUP, 0, 0)},
		{"ptrace(PEEKDATA, 0)", false, false, sc(unix.SYS_PTRACE, unix.PTRACE_PEEKDATA, 0, 0, 0)},
		{"mount(NULL)", false, false, sc(unix.SYS_MOUNT, 0, 0, 0, 0, 0)},
		{"bpf(-1, NULL)", true, false, sc(unix.SYS_BPF, bad, 0, 0)},
		{"perf_event_open(NULL)", true, false, sc(unix.SYS_PERF_EVENT_OPEN, 0, 0, bad, bad, 0)},
		{"userfaultfd(-1)", true, false, sc(unix.SYS_USERFAULTFD, bad)},
		{"kexec_load(0)", true, false, sc(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0)},
		{"open_by_handle_at(-1, NULL)", true, false, sc(unix.SYS_OPEN_BY_HANDLE_AT, bad, 0, 0)},
	}
}

func checkSeccomp(_ context.Context, p Params, c *Check) {
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(tasks) == 0 {
		c.Verdict, c.Reason = Error, "no /proc/self/task/*/status"
		return
	}
	modes := map[string]int{}
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		m := statusField(string(b), "Seccomp")
		modes[m]++
		if m != "2" {
			c.escape("thread %s has Seccomp=%s (no filter)", filepath.Base(filepath.Dir(t)), m)
		}
	}
	c.Observed = "Seccomp modes: " + fmtModes(modes)
	var allowedSoft []string
	for _, b := range badCalls() {
		err := b.call()
		if blocked(err) {
			c.ev("%s: %s (blocked)", b.name, errnoName(err))
			continue
		}
		c.ev("%s: %s (allowed by seccomp)", b.name, errnoName(err))
		switch {
		case b.tty && !terminalReachable():
			c.ev("%s: allowed, but no terminal is reachable from the cage", b.name)
		case b.must || p.StrictSeccomp:
			c.escape("%s is allowed", b.name)
		default:
			allowedSoft = append(allowedSoft, b.name)
		}
	}
	if len(allowedSoft) > 0 {
		c.settle(Residual, "podman's default seccomp profile allows "+strings.Join(allowedSoft, ", ")+"; set cage.seccomp to shrooms' profile")
		return
	}
	c.settle(Sealed, "")
}

func fmtModes(m map[string]int) string {
	var s []string
	for k, v := range m {
		s = append(s, k+"×"+strconv.Itoa(v))
	}
	return strings.Join(s, " ")
}

func checkLSM(_ context.Context, _ Params, c *Check) {
	b, err := os.ReadFile("/proc/self/attr/current")
	label := strings.TrimSpace(strings.TrimRight(string(b), "\x00"))
	switch {
	case err != nil:
		c.Observed = "unreadable: " + errnoName(err)
	default:
		c.Observed = label
	}
	if label == "" || label == "unconfined" || err != nil {
		c.ev("no AppArmor profile or SELinux label confines the cage")
		c.settle(Residual, "the host runs no LSM (AppArmor/SELinux) for containers; caps, seccomp, userns and read-only mounts carry the confinement")
		return
	}
	c.settle(Sealed, "")
}

func checkUserNS(_ context.Context, p Params, c *Check) {
	var maps [2]string
	for i, f := range []string{"uid_map", "gid_map"} {
		b, err := os.ReadFile("/proc/self/" + f)
		if err != nil {
			c.Verdict, c.Reason = Error, err.Error()
			return
		}
		maps[i] = string(b)
	}
	judgeIDMaps(c, sentry(p), maps)
	c.ev("euid %d", unix.Geteuid())
}

// judgeIDMaps judges the uid_map and gid_map the cage reads. Under gVisor
// (gv) both are the Sentry's own identity map, and the row is left to the
// host side (JudgeSandbox); only both together say so: one identity map
// beside another is judged as it reads (the identity maps host root).
func judgeIDMaps(c *Check, gv bool, maps [2]string) {
	var obs []string
	sentryMaps := 0
	for i, f := range []string{"uid_map", "gid_map"} {
		m := strings.Join(strings.Fields(maps[i]), " ")
		obs = append(obs, f+": "+m)
		if gv && m == sentryIDMap {
			sentryMaps++
		}
	}
	c.Observed = strings.Join(obs, "; ")
	if sentryMaps == 2 {
		// The Sentry's own maps: the task's user namespace, if any, is the
		// sandbox's on the host, which only the host side sees (JudgeSandbox).
		c.ev("gVisor: uid_map and gid_map are the Sentry's own (%s); the host side judges the sandbox's host ids", sentryIDMap)
		c.settle(Error, sentryIDReason)
		return
	}
	for i, f := range []string{"uid_map", "gid_map"} {
		for _, l := range strings.Split(strings.TrimSpace(maps[i]), "\n") {
			fl := strings.Fields(l)
			if len(fl) != 3 {
				continue
			}
			if fl[0] == "0" && fl[1] == "0" {
				c.escape("%s maps container root to host root (%s): no user namespace", f, strings.TrimSpace(l))
			} else if fl[1] == "0" {
				c.escape("%s maps container id %s to host root", f, fl[0])
			}
		}
	}
	c.settle(Sealed, "")
}

// Initial (host) namespaces have fixed inode numbers (PROC_*_INIT_INO).
const initInoMin, initInoMax = 0xEFFFFFF0, 0xEFFFFFFF

func checkHostNS(_ context.Context, _ Params, c *Check) {
	var obs []string
	for _, ns := range []string{"pid", "ipc", "uts", "net", "user", "cgroup", "mnt", "time"} {
		var st unix.Stat_t
		if err := unix.Stat("/proc/self/ns/"+ns, &st); err != nil {
			continue
		}
		obs = append(obs, ns+"="+strconv.FormatUint(st.Ino, 10))
		if st.Ino >= initInoMin && st.Ino <= initInoMax && ns != "time" {
			c.escape("%s namespace is the host's initial one (inode %#x)", ns, st.Ino)
		}
	}
	c.Observed = strings.Join(obs, " ")
	cmd, _ := os.ReadFile("/proc/1/cmdline")
	pid1 := strings.ReplaceAll(strings.TrimRight(string(cmd), "\x00"), "\x00", " ")
	c.ev("pid 1: %q", pid1)
	if strings.Contains(pid1, "systemd") || pid1 == "/sbin/init" || strings.HasPrefix(pid1, "init") {
		c.escape("pid 1 is the host's init (%q)", pid1)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	c.ev("%d processes visible", len(procs))
	if b, err := os.ReadFile("/proc/net/unix"); err == nil {
		var paths []string
		for _, l := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(l)
			if len(f) >= 8 {
				paths = append(paths, f[7])
			}
		}
		c.ev("unix sockets with names in this network namespace: %d", len(paths))
		for _, pth := range paths {
			if strings.Contains(pth, "podman") || strings.Contains(pth, "docker") || strings.Contains(pth, "containerd") || strings.Contains(pth, "systemd") || strings.Contains(pth, "dbus") {
				c.escape("host socket %s is in this network namespace", pth)
			}
		}
	}
	c.settle(Sealed, "")
}

func checkReadOnly(_ context.Context, p Params, c *Check) {
	var created []string
	gv := sentry(p)
	for _, d := range []string{"/", "/etc", "/usr", "/var", "/opt", "/bin", "/sbin", "/lib"} {
		p := filepath.Join(d, ".shrooms-probe")
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
		if err == nil {
			unix.Close(fd)
			unix.Unlink(p)
			created = append(created, d)
			c.escape("created a file in %s", d)
			continue
		}
		c.ev("create in %s: %s", d, errnoName(err))
	}
	ms, err := mountTable()
	if err != nil {
		c.Verdict, c.Reason = Error, err.Error()
		return
	}
	var rw []string
	for _, m := range ms {
		if !hasOpt(m.opts, "rw") {
			continue
		}
		rw = append(rw, m.point)
		if m.point == "/" {
			c.escape("the root filesystem is mounted read-write")
		} else if gv && m.fstype == "cgroup" && strings.HasPrefix(m.point, "/sys/fs/cgroup/") {
			sentryCgroup(c, m.point)
		} else if !underAny(m.point, sandboxedRW) && !(m.point == "/sys/fs/cgroup" && m.fstype == "tmpfs") {
			c.escape("%s (%s) is mounted read-write", m.point, m.fstype)
		}
	}
	c.Observed = "rw mounts: " + strings.Join(rw, " ")
	c.settle(Sealed, "")
}

// terminalReachable reports whether any inherited fd or /dev/tty is a
// terminal (TIOCSTI needs one).
func terminalReachable() bool {
	for fd := 0; fd < 3; fd++ {
		if _, err := unix.IoctlGetTermios(fd, unix.TCGETS); err == nil {
			return true
		}
	}
	fd, err := unix.Open("/dev/tty", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}
