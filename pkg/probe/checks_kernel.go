package probe

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func kernelChecks() []check {
	return []check{
		{"B1", "writable /proc/sys and /sys hooks", "zero-byte open-for-write of core_pattern, modprobe, binfmt_misc/register, panic_on_oom, suid_dumpable, sysrq-trigger, uevent_helper, securityfs, efivars; RLIMIT_CORE is 0", checkHooks},
		{"B2", "masked paths", "stat/read kcore, keys, timer_list, sched_debug, acpi, scsi, latency_stats, /sys/firmware", checkMasked},
		{"B3", "cgroup escape", "fstype of /sys/fs/cgroup; release_agent; mkdir and zero-byte writes in the cgroup tree", checkCgroup},
		{"B4", "nested user namespace", "clone(CLONE_NEWUSER|CLONE_NEWNS) a child that mounts a tmpfs inside it", checkNestedUserNS},
		{"B5", "mount / pivot_root / shocker", "mount tmpfs, pivot_root, open_by_handle_at in the cage's namespace", checkMount},
		{"B6", "devices", "list /dev; open kvm, mem, kmem, port, disks, fuse, net/tun; mknod a block device", checkDevices},
		{"B7", "ptrace", "CAP_SYS_PTRACE, Yama ptrace_scope, foreign processes, process_vm_readv on them", checkPtrace},
		{"B8", "kernel keyring", "keyctl DESCRIBE sweep around the session keyring; read /proc/keys", checkKeyring},
		{"B9", "TIOCSTI", "TIOCSTI and its high-bits variant on the inherited fds and /dev/tty", checkTIOCSTI},
		{"B10", "kernel info leaks", "dmesg, kallsyms addresses, debugfs, config.gz, uname", checkKernelInfo},
		{"B11", "socket families", "socket() with an invalid type for vsock, alg, key, packet, bluetooth and other families, and netlink protocols besides routing; open AF_VSOCK", checkSocketFamilies},
	}
}

func checkHooks(_ context.Context, _ Params, c *Check) {
	for _, p := range []string{
		"/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe", "/proc/sys/fs/binfmt_misc/register",
		"/proc/sys/vm/panic_on_oom", "/proc/sys/fs/suid_dumpable", "/proc/sysrq-trigger",
		"/sys/kernel/uevent_helper", "/sys/kernel/security/lsm", "/sys/firmware/efi/efivars",
		"/proc/sys/kernel/hostname",
	} {
		err := openWrite(p)
		if err == nil {
			c.escape("%s is open for writing", p)
			continue
		}
		c.ev("%s: %s", p, errnoName(err))
	}
	// A read-write /proc/sys or /sys would let any hook be rewritten by root.
	if ms, err := mountTable(); err == nil {
		for _, m := range ms {
			if (m.point == "/proc/sys" || m.point == "/sys") && hasOpt(m.opts, "rw") {
				c.escape("%s is mounted read-write", m.point)
			}
		}
	}
	hooks := len(c.Evidence)
	// A core dump hands the crashing process's memory to the host's
	// core_pattern (often a pipe to a root helper outside the cage).
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_CORE, &lim); err != nil {
		c.Verdict, c.Reason = Error, "getrlimit(RLIMIT_CORE): "+err.Error()
		return
	}
	pattern, _ := os.ReadFile("/proc/sys/kernel/core_pattern")
	c.ev("RLIMIT_CORE soft %d hard %d; core_pattern %q", lim.Cur, lim.Max, strings.TrimSpace(string(pattern)))
	if lim.Cur != 0 || lim.Max != 0 {
		c.escape("core dumps are on (RLIMIT_CORE soft %d hard %d): a crash hands cage memory to the host's core_pattern", lim.Cur, lim.Max)
	}
	c.Observed = fmt.Sprintf("%d hooks tried; RLIMIT_CORE %d/%d", hooks, lim.Cur, lim.Max)
	c.settle(Sealed, "")
}

func checkMasked(_ context.Context, _ Params, c *Check) {
	for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/acpi", "/proc/scsi", "/proc/latency_stats", "/sys/firmware", "/sys/fs/selinux", "/sys/dev/block"} {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			c.ev("%s: %s", p, errnoName(err))
			continue
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			if unix.Major(st.Rdev) == 1 && unix.Minor(st.Rdev) == 3 {
				c.ev("%s: /dev/null", p)
				continue
			}
		case unix.S_IFDIR:
			ents, err := os.ReadDir(p)
			if err != nil || len(ents) == 0 {
				c.ev("%s: empty or unreadable directory", p)
				continue
			}
			c.escape("%s lists %d entries", p, len(ents))
			continue
		}
		if s, err := readSmall(p, 64); err != nil || s == "" {
			c.ev("%s: unreadable or empty (%s)", p, errnoName(err))
			continue
		}
		c.escape("%s is readable", p)
	}
	c.Observed = "masked paths checked"
	c.settle(Sealed, "")
}

func checkCgroup(_ context.Context, _ Params, c *Check) {
	var sfs unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &sfs); err == nil {
		switch sfs.Type {
		case unix.CGROUP2_SUPER_MAGIC:
			c.Observed = "cgroup2"
		case unix.TMPFS_MAGIC:
			c.Observed = "tmpfs (cgroup v1 hierarchy)"
		default:
			c.Observed = fmt.Sprintf("fs type %#x", sfs.Type)
		}
	}
	var ras []string
	filepath.WalkDir("/sys/fs/cgroup", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Name() == "release_agent" || d.Name() == "notify_on_release" {
			ras = append(ras, p)
		}
		return nil
	})
	c.ev("release_agent/notify_on_release files: %v", ras)
	for _, p := range ras {
		if err := openWrite(p); err == nil {
			c.escape("%s is writable", p)
		}
	}
	for _, p := range []string{"/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/cgroup.subtree_control"} {
		if err := openWrite(p); err == nil {
			c.escape("%s is writable", p)
		} else {
			c.ev("%s: %s", p, errnoName(err))
		}
	}
	d := "/sys/fs/cgroup/shrooms-probe"
	if err := unix.Mkdir(d, 0o700); err == nil {
		unix.Rmdir(d)
		c.escape("created cgroup %s", d)
	} else {
		c.ev("mkdir %s: %s", d, errnoName(err))
	}
	tmp, err := os.MkdirTemp("", "probe-cg")
	if err == nil {
		defer os.Remove(tmp)
		for _, opt := range []string{"rdma", "memory"} {
			if err := unix.Mount("cgroup", tmp, "cgroup", 0, opt); err == nil {
				unix.Unmount(tmp, unix.MNT_DETACH)
				c.escape("mounted cgroup v1 %s", opt)
			} else {
				c.ev("mount -t cgroup -o %s: %s", opt, errnoName(err))
			}
		}
	}
	c.settle(Sealed, "")
}

// NestedChildArg makes `shrooms probe inside` act as the B4 child: it runs inside a
// new user and mount namespace and tries to mount a tmpfs there.
const NestedChildArg = "--nested-userns-child"

// NestedChild is the body of the B4 child process (called by the CLI).
func NestedChild() int {
	dir, err := os.MkdirTemp("", "probe-userns")
	if err != nil {
		fmt.Println("mkdtemp:", errnoName(err))
		return 2
	}
	if err := unix.Mount("none", dir, "tmpfs", 0, "size=1m"); err != nil {
		fmt.Println("mount tmpfs:", errnoName(err))
		return 1
	}
	unix.Unmount(dir, unix.MNT_DETACH)
	fmt.Println("mounted tmpfs in a nested user namespace")
	return 0
}

func checkNestedUserNS(ctx context.Context, p Params, c *Check) {
	self, err := os.Executable()
	if err != nil {
		c.Verdict, c.Reason = Error, "cannot find own executable: "+err.Error()
		return
	}
	cctx, cancel := withTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, self, append(append([]string{}, InsideArgs...), NestedChildArg)...)
	uid, gid := os.Getuid(), os.Getgid()
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}},
	}
	out, err := cmd.CombinedOutput()
	msg := strings.TrimSpace(string(out))
	if err != nil && cmd.Process == nil {
		c.Errno = errnoName(err)
		c.Observed = "clone(CLONE_NEWUSER) refused: " + err.Error()
		if !blocked(err) {
			c.Verdict, c.Reason = Error, "unexpected error creating the child: "+err.Error()
			return
		}
		c.settle(Sealed, "")
		return
	}
	c.Observed = "child in a new user namespace: " + msg
	if err == nil {
		if p.StrictSeccomp {
			c.escape("a nested user namespace was created and a tmpfs mounted in it")
			return
		}
		c.settle(Residual, "podman's default seccomp profile allows nested user namespaces (more kernel attack surface); shrooms' profile denies them")
		return
	}
	c.ev("child exit: %v", err)
	if p.StrictSeccomp {
		c.escape("a nested user namespace was created")
		return
	}
	c.settle(Residual, "nested user namespaces can be created (mount inside refused); shrooms' seccomp profile denies them")
}

func checkMount(_ context.Context, _ Params, c *Check) {
	dir, err := os.MkdirTemp("", "probe-mnt")
	if err != nil {
		c.Verdict, c.Reason = Error, err.Error()
		return
	}
	defer os.Remove(dir)
	if err := unix.Mount("none", dir, "tmpfs", 0, "size=1m"); err == nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		c.escape("mounted a tmpfs in the cage's mount namespace")
	} else {
		c.Errno = errnoName(err)
		c.ev("mount tmpfs: %s", errnoName(err))
	}
	if err := unix.PivotRoot(dir, dir); err == nil {
		c.escape("pivot_root succeeded")
	} else {
		c.ev("pivot_root: %s", errnoName(err))
		if !blocked(err) {
			c.escape("pivot_root reached its argument checks (%s): CAP_SYS_ADMIN and seccomp let it through", errnoName(err))
		}
	}
	// A well-formed handle on the root fd: EPERM/ENOSYS without
	// CAP_DAC_READ_SEARCH, anything else means shocker would work.
	root, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err == nil {
		h := unix.NewFileHandle(1, []byte{2, 0, 0, 0, 0, 0, 0, 0})
		fd, err := unix.OpenByHandleAt(root, h, unix.O_RDONLY)
		unix.Close(root)
		if err == nil {
			unix.Close(fd)
			c.escape("open_by_handle_at opened inode 2 of the root filesystem")
		} else {
			c.ev("open_by_handle_at: %s", errnoName(err))
			if !blocked(err) {
				c.escape("open_by_handle_at is permitted (%s)", errnoName(err))
			}
		}
	}
	c.Observed = "mount " + c.Errno
	c.settle(Sealed, "")
}

var stdDevices = map[string]bool{"console": true, "core": true, "fd": true, "full": true, "mqueue": true, "null": true, "ptmx": true, "pts": true, "random": true, "shm": true, "stderr": true, "stdin": true, "stdout": true, "tty": true, "urandom": true, "zero": true}

func checkDevices(_ context.Context, p Params, c *Check) {
	ents, err := os.ReadDir("/dev")
	if err != nil {
		c.Verdict, c.Reason = Error, err.Error()
		return
	}
	// Under gVisor /dev is the Sentry's: its fuse, net/tun and char are
	// judged by what they can do, not by their names.
	gv := sentry(p)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
		switch {
		case stdDevices[e.Name()]:
		case gv && (e.Name() == "fuse" || e.Name() == "net"):
		case gv && e.Name() == "char" && sentryCharDir(c):
		default:
			c.escape("/dev/%s is not a standard pseudo-device", e.Name())
		}
	}
	c.Observed = strings.Join(names, " ")
	for _, d := range []string{"/dev/kvm", "/dev/mem", "/dev/kmem", "/dev/port", "/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/dm-0", "/dev/fuse", "/dev/net/tun"} {
		fd, err := unix.Open(d, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err == nil {
			unix.Close(fd)
			if gv {
				sentryDevice(c, d)
			} else {
				c.escape("opened %s", d)
			}
		} else if !os.IsNotExist(err) {
			c.ev("%s: %s", d, errnoName(err))
		}
	}
	for _, dir := range []string{"/dev/shm", "/tmp"} {
		p := filepath.Join(dir, ".probe-blk")
		if err := unix.Mknod(p, unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))); err == nil {
			unix.Unlink(p)
			c.escape("mknod of a block device in %s", dir)
		} else {
			c.ev("mknod block 8:0 in %s: %s", dir, errnoName(err))
		}
	}
	c.settle(Sealed, "")
}

func checkPtrace(_ context.Context, _ Params, c *Check) {
	st, _ := os.ReadFile("/proc/self/status")
	eff, _ := strconv.ParseUint(statusField(string(st), "CapEff"), 16, 64)
	if eff&(1<<unix.CAP_SYS_PTRACE) != 0 {
		c.escape("CAP_SYS_PTRACE is effective")
	}
	yama, err := readSmall("/proc/sys/kernel/yama/ptrace_scope", 8)
	if err != nil {
		yama = "absent"
	}
	c.Observed = "ptrace_scope=" + strings.TrimSpace(yama)
	me := os.Getuid()
	procs, _ := filepath.Glob("/proc/[0-9]*")
	foreign := 0
	for _, pd := range procs {
		b, err := os.ReadFile(pd + "/status")
		if err != nil {
			continue
		}
		f := strings.Fields(statusField(string(b), "Uid"))
		if len(f) == 0 {
			continue
		}
		uid, _ := strconv.Atoi(f[0])
		if uid == 65534 || (uid != me && uid == 0 && os.Getuid() != 0) {
			foreign++
			pid, _ := strconv.Atoi(filepath.Base(pd))
			buf := make([]byte, 1)
			local := []unix.Iovec{{Base: &buf[0], Len: 1}}
			remote := []unix.RemoteIovec{{Base: 0x400000, Len: 1}}
			if _, err := unix.ProcessVMReadv(pid, local, remote, 0); err == nil || !blocked(err) && err != unix.ESRCH {
				c.escape("process_vm_readv on foreign pid %d: %s", pid, errnoName(err))
			}
		}
	}
	c.ev("%d processes visible, %d owned by ids outside this user namespace", len(procs), foreign)
	if foreign > 0 {
		c.escape("%d processes from outside the cage are visible", foreign)
	}
	c.settle(Sealed, "")
}

func checkKeyring(_ context.Context, _ Params, c *Check) {
	if s, err := readSmall("/proc/keys", 4096); err == nil && strings.TrimSpace(s) != "" {
		c.ev("/proc/keys readable: %d lines", strings.Count(s, "\n"))
	} else {
		c.ev("/proc/keys: %s", errnoName(err))
	}
	own, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	if err != nil {
		c.Errno = errnoName(err)
		c.Observed = "keyctl(GET_KEYRING_ID): " + c.Errno
		if blocked(err) {
			c.settle(Sealed, "")
			return
		}
		c.ev("no session keyring: %s", errnoName(err))
	}
	mine := map[int]bool{}
	for _, spec := range []int{unix.KEY_SPEC_SESSION_KEYRING, unix.KEY_SPEC_USER_KEYRING, unix.KEY_SPEC_USER_SESSION_KEYRING, unix.KEY_SPEC_PROCESS_KEYRING, unix.KEY_SPEC_THREAD_KEYRING} {
		if id, err := unix.KeyctlGetKeyringID(spec, false); err == nil {
			mine[id] = true
		}
	}
	found := 0
	base := own
	if base <= 0 {
		base = 1
	}
	for id := base - 3000; id < base+3000; id++ {
		if id <= 0 || mine[id] {
			continue
		}
		desc, err := unix.KeyctlString(unix.KEYCTL_DESCRIBE, id)
		if err != nil {
			continue
		}
		found++
		if found <= 5 {
			c.ev("key %d: %s", id, desc)
		}
	}
	c.Observed = fmt.Sprintf("session keyring %d; %d other keys described", own, found)
	if found > 0 {
		c.escape("%d keys outside the cage's own keyrings can be described", found)
		return
	}
	c.settle(Sealed, "")
}

func checkTIOCSTI(_ context.Context, p Params, c *Check) {
	ttys := 0
	try := func(name string, fd int) {
		if _, err := unix.IoctlGetTermios(fd, unix.TCGETS); err != nil {
			return
		}
		ttys++
		// Injecting a NUL byte is as harmless as it gets, and only when
		// the kernel lets the call through at all.
		var b byte
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCSTI, uintptr(unsafePtr(&b)))
		if e == 0 {
			c.escape("TIOCSTI on %s injected a byte", name)
		} else {
			c.ev("TIOCSTI on %s: %s", name, errnoName(e))
		}
	}
	for fd, n := range []string{"stdin", "stdout", "stderr"} {
		try(n, fd)
	}
	if fd, err := unix.Open("/dev/tty", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0); err == nil {
		try("/dev/tty", fd)
		unix.Close(fd)
	} else {
		c.ev("/dev/tty: %s (no controlling terminal)", errnoName(err))
	}
	allowed := []string{}
	for _, cmd := range []uintptr{unix.TIOCSTI, 1<<32 | unix.TIOCSTI} {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, ^uintptr(0), cmd, 0)
		c.ev("ioctl(-1, %#x): %s", cmd, errnoName(e))
		if !blocked(e) {
			allowed = append(allowed, fmt.Sprintf("%#x", cmd))
		}
	}
	c.Observed = fmt.Sprintf("%d terminals reachable; seccomp allows TIOCSTI forms %v", ttys, allowed)
	if len(allowed) > 0 && ttys > 0 {
		c.settle(Residual, "a terminal is reachable and seccomp allows TIOCSTI; run the cage without a tty")
		return
	}
	c.settle(Sealed, "")
}

// kernelRelease is uname's release of the kernel this process runs on.
func kernelRelease() string {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return ""
	}
	return string(bytes.TrimRight(uts.Release[:], "\x00"))
}

func checkKernelInfo(_ context.Context, p Params, c *Check) {
	rel := kernelRelease()
	c.Observed = "kernel " + rel
	// A kernel of the cage's own (gVisor's Sentry) answers uname with
	// another release; its log, addresses and files are its own.
	own := p.HostKernel != "" && rel != "" && rel != p.HostKernel
	buf := make([]byte, 4096)
	if n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf); err == nil && n > 0 {
		if !own || bytes.Contains(buf[:n], []byte(p.HostKernel)) {
			c.escape("dmesg is readable")
		} else {
			c.ev("dmesg: the cage kernel's own log (%q), no host release in it", firstLine(buf[:n]))
		}
	} else {
		c.ev("dmesg: %s", errnoName(err))
	}
	if s, err := readSmall("/proc/kallsyms", 4096); err == nil {
		nonzero := 0
		for _, l := range strings.Split(s, "\n") {
			if f := strings.Fields(l); len(f) > 0 && strings.Trim(f[0], "0") != "" {
				nonzero++
			}
		}
		if nonzero > 0 {
			c.escape("/proc/kallsyms shows kernel addresses")
		} else {
			c.ev("/proc/kallsyms: addresses zeroed")
		}
	} else {
		c.ev("/proc/kallsyms: %s", errnoName(err))
	}
	if ents, err := os.ReadDir("/sys/kernel/debug"); err == nil && len(ents) > 0 {
		c.escape("debugfs lists %d entries", len(ents))
	} else {
		c.ev("/sys/kernel/debug: empty or %s", errnoName(err))
	}
	if f, err := os.Open("/proc/config.gz"); err == nil {
		if _, err := gzip.NewReader(f); err == nil {
			c.ev("/proc/config.gz readable (kernel build config)")
		}
		f.Close()
	}
	if own {
		c.settle(Sealed, "the cage runs on a kernel of its own ("+rel+", not the host's "+p.HostKernel+"): host kernel bugs are behind it")
		return
	}
	c.settle(Residual, "the cage shares the host kernel: its version ("+rel+", "+runtime.GOARCH+") is visible and kernel bugs are in reach; keep the host kernel patched")
}

// socketFamily is one socket() the cage has no use for.
type socketFamily struct {
	name          string
	family, proto int
	allowed       bool // unix, inet, inet6, netlink routing: must reach the kernel
}

func socketFamilies() []socketFamily {
	return []socketFamily{
		{"AF_UNIX", unix.AF_UNIX, 0, true},
		{"AF_INET", unix.AF_INET, 0, true},
		{"AF_INET6", unix.AF_INET6, 0, true},
		{"AF_NETLINK/ROUTE", unix.AF_NETLINK, unix.NETLINK_ROUTE, true},
		{"AF_VSOCK", unix.AF_VSOCK, 0, false},
		{"AF_ALG", unix.AF_ALG, 0, false},
		{"AF_KEY", unix.AF_KEY, 0, false},
		{"AF_PACKET", unix.AF_PACKET, 0, false},
		{"AF_BLUETOOTH", unix.AF_BLUETOOTH, 0, false},
		{"AF_TIPC", unix.AF_TIPC, 0, false},
		{"AF_RDS", unix.AF_RDS, 0, false},
		{"AF_CAN", unix.AF_CAN, 0, false},
		{"AF_XDP", unix.AF_XDP, 0, false},
		{"AF_KCM", unix.AF_KCM, 0, false},
		{"AF_SMC", unix.AF_SMC, 0, false},
		{"AF_QIPCRTR", unix.AF_QIPCRTR, 0, false},
		{"AF_NFC", unix.AF_NFC, 0, false},
		{"AF_X25", unix.AF_X25, 0, false},
		{"AF_AX25", unix.AF_AX25, 0, false},
		{"AF_APPLETALK", unix.AF_APPLETALK, 0, false},
		{"AF_LLC", unix.AF_LLC, 0, false},
		{"AF_PPPOX", unix.AF_PPPOX, 0, false},
		{"AF_NETLINK/NETFILTER", unix.AF_NETLINK, unix.NETLINK_NETFILTER, false},
		{"AF_NETLINK/SOCK_DIAG", unix.AF_NETLINK, unix.NETLINK_SOCK_DIAG, false},
		{"AF_NETLINK/XFRM", unix.AF_NETLINK, unix.NETLINK_XFRM, false},
		{"AF_NETLINK/CRYPTO", unix.AF_NETLINK, unix.NETLINK_CRYPTO, false},
		{"AF_NETLINK/KOBJECT_UEVENT", unix.AF_NETLINK, unix.NETLINK_KOBJECT_UEVENT, false},
	}
}

// checkSocketFamilies asks, without opening anything, which families reach
// the kernel: the kernel rejects an invalid socket type (15) with EINVAL
// before it looks the family up, so EINVAL means the call got past seccomp
// whether or not the kernel has the family, and EAFNOSUPPORT or
// EPROTONOSUPPORT that the filter refused it. AF_VSOCK is also opened for
// real (nothing is sent): on a VM host it reaches the hypervisor and host
// vsock services without crossing the network seal.
func checkSocketFamilies(_ context.Context, p Params, c *Check) {
	const badType = 15
	var reached []string
	gv := sentry(p)
	if gv {
		// The Sentry answers an invalid type by its own rules (AF_INET:
		// EAFNOSUPPORT), so the EINVAL control does not hold; what does is
		// that its socket() is the Sentry's and the profile is enforced in it.
		mode := seccompMode()
		c.ev("gVisor: socket() is the Sentry's; seccomp mode %q", mode)
		if mode != "2" {
			if p.StrictSeccomp {
				c.escape("no seccomp filter in the Sentry (mode %q): the cage's profile is not enforced (runsc needs --oci-seccomp)", mode)
			} else {
				c.Verdict, c.Reason = Error, "no seccomp filter in the Sentry: the families it has are in reach unfiltered"
			}
		}
	}
	for _, f := range socketFamilies() {
		fd, err := unix.Socket(f.family, badType, f.proto)
		if err == nil {
			unix.Close(fd)
		}
		c.ev("socket(%s, 15): %s", f.name, errnoName(err))
		if gv {
			r, ok := sentrySocket(err)
			switch {
			case f.allowed:
			case !ok:
				c.Verdict, c.Reason = Error, fmt.Sprintf("socket(%s) with an invalid type gave %s under gVisor: neither the profile's EPERM, a family the Sentry lacks, nor EINVAL", f.name, errnoName(err))
				return
			case r:
				reached = append(reached, f.name)
				if p.StrictSeccomp {
					c.escape("socket(%s) reaches the Sentry's implementation", f.name)
				}
			}
			continue
		}
		switch {
		case f.allowed && !errors.Is(err, unix.EINVAL):
			c.Verdict, c.Reason = Error, fmt.Sprintf("socket(%s) with an invalid type gave %s, not EINVAL: the test cannot tell seccomp from the kernel here", f.name, errnoName(err))
			return
		case f.allowed:
		case errors.Is(err, unix.EINVAL):
			reached = append(reached, f.name)
			if p.StrictSeccomp {
				c.escape("socket(%s) reaches the kernel", f.name)
			}
		}
	}
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
		c.escape("socket(AF_VSOCK, SOCK_STREAM) opens: a channel to the hypervisor and host vsock services outside the network seal")
	} else {
		c.ev("socket(AF_VSOCK, SOCK_STREAM): %s", errnoName(err))
	}
	c.Observed = fmt.Sprintf("%d of %d unneeded families reach the kernel", len(reached), len(socketFamilies())-4)
	if len(reached) > 0 {
		c.settle(Residual, "podman's default seccomp profile allows "+strings.Join(reached, ", ")+"; set cage.seccomp to shrooms' profile")
		return
	}
	c.settle(Sealed, "")
}

func firstLine(b []byte) string {
	l, _, _ := bytes.Cut(bytes.TrimSpace(b), []byte("\n"))
	return string(l)
}
