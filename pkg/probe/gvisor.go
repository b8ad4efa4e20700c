package probe

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Under gVisor (runsc) the cage sees the Sentry's own id map, cgroupfs and
// /dev. A row reads them as the Sentry's only when the cage is measured to
// run on it (sentry), and each such row proves its seal with a check of
// its own, never by the runtime's name (docs/gvisor.md).

// sentry reports whether the cage runs on gVisor's Sentry, measured: the
// kernel answering uname is not the host's (HostKernel, which the outside
// passes) and names itself gVisor's (its release, or its log's first line).
// Without HostKernel (a bare `probe inside`) it is false and every row
// judges as under runc.
func sentry(p Params) bool {
	rel := kernelRelease()
	if p.HostKernel == "" || rel == "" || rel == p.HostKernel {
		return false
	}
	if strings.Contains(rel, "gvisor") {
		return true
	}
	buf := make([]byte, 256)
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	return err == nil && n > 0 && bytes.Contains(buf[:n], []byte("Starting gVisor"))
}

// sentryIDMap is the Sentry's own id map: the identity over every id. The
// task's user namespace is then on the host side (the sandbox and gofer
// run as the task range's base ids), which only the host can see.
const sentryIDMap = "0 0 4294967295"

// SandboxRow is the row the host side judges from the runsc processes'
// host ids (JudgeSandbox).
const SandboxRow = "A5"

// cgroupWritable tries, as the cage's user, to write the cgroup hierarchy
// mounted at dir without changing it: open its control files for writing
// (no truncation, nothing written) and create a child group (removed
// again). It returns what succeeded and the evidence.
func cgroupWritable(dir string) (wrote []string, ev []string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, []string{dir + ": " + errnoName(err)}
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err == nil {
			unix.Close(fd)
			wrote = append(wrote, "open "+p+" for writing")
			continue
		}
		ev = append(ev, "open "+p+" for writing: "+errnoName(err))
	}
	child := filepath.Join(dir, ".shrooms-probe")
	if err := unix.Mkdir(child, 0o700); err == nil {
		unix.Rmdir(child)
		wrote = append(wrote, "mkdir "+child)
	} else {
		ev = append(ev, "mkdir "+child+": "+errnoName(err))
	}
	return wrote, ev
}

// sentryCgroup judges a read-write cgroup mount under gVisor: the Sentry's
// own cgroupfs (its limits are the Sentry's bookkeeping; the host cgroup is
// podman's, out of sight). It is sealed only when the cage cannot write it
// at all; a write the cage could make is reported, not excused.
func sentryCgroup(c *Check, point string) {
	wrote, ev := cgroupWritable(point)
	for _, w := range wrote {
		c.escape("%s: the Sentry's cgroupfs is writable by the cage (%s)", point, w)
	}
	if len(wrote) == 0 {
		c.ev("%s: the Sentry's cgroupfs, mounted rw, but the cage writes none of it (%s)", point, strings.Join(ev, "; "))
	}
}

// sentryDevice judges a device node the Sentry offers that opened: what
// the open fd can do without capabilities. /dev/fuse serves nothing until
// a mount names it (mount needs CAP_SYS_ADMIN and is denied by the seccomp
// profile), /dev/net/tun makes no interface without CAP_NET_ADMIN
// (TUNSETIFF). Anything else that opens is an escape.
func sentryDevice(c *Check, dev string) {
	switch dev {
	case "/dev/fuse":
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			c.ev("%s: opened read-only; read-write: %s", dev, errnoName(err))
			return
		}
		defer unix.Close(fd)
		dir, err := os.MkdirTemp("", ".probe-fuse")
		if err != nil {
			c.Verdict, c.Reason = Error, "fuse mount point: "+err.Error()
			return
		}
		defer os.Remove(dir)
		opts := "fd=" + strconv.Itoa(fd) + ",rootmode=40000,user_id=" + strconv.Itoa(unix.Getuid()) + ",group_id=" + strconv.Itoa(unix.Getgid())
		if err := unix.Mount("probe", dir, "fuse", unix.MS_NOSUID|unix.MS_NODEV, opts); err == nil {
			unix.Unmount(dir, unix.MNT_DETACH)
			c.escape("mounted a FUSE filesystem through the Sentry's /dev/fuse")
		} else {
			c.ev("%s opens (the Sentry's); mount of a FUSE filesystem on it: %s; unmounted, the fd serves nothing", dev, errnoName(err))
		}
	case "/dev/net/tun":
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			c.ev("%s: opened read-only; read-write: %s", dev, errnoName(err))
			return
		}
		defer unix.Close(fd)
		ifr, err := unix.NewIfreq("probe0")
		if err != nil {
			c.Verdict, c.Reason = Error, err.Error()
			return
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err == nil {
			c.escape("made a TUN interface through the Sentry's /dev/net/tun")
		} else {
			c.ev("%s opens (the Sentry's netstack); TUNSETIFF: %s", dev, errnoName(err))
		}
	default:
		c.escape("opened %s", dev)
	}
}

// sentryCharDir accepts the Sentry's /dev/char when each entry is a link
// to a device of /dev the row judges anyway (standard ones, fuse, net/tun).
func sentryCharDir(c *Check) bool {
	ents, err := os.ReadDir("/dev/char")
	if err != nil {
		return false
	}
	var links []string
	for _, e := range ents {
		t, err := os.Readlink(filepath.Join("/dev/char", e.Name()))
		name, ok := strings.CutPrefix(t, "../")
		if err != nil || !ok || (!stdDevices[name] && name != "fuse" && name != "net/tun") {
			return false
		}
		links = append(links, e.Name()+"→"+name)
	}
	c.ev("/dev/char: the Sentry's links to its own devices (%s)", strings.Join(links, " "))
	return true
}

// sentrySocket judges socket(family, invalid type) under gVisor. runsc
// answers every errno of the OCI profile with EPERM (google/gvisor#14688),
// so EPERM is the profile's refusal; EAFNOSUPPORT, EPROTONOSUPPORT and
// ESOCKTNOSUPPORT that the Sentry has no such family or protocol: either
// way the call reaches no host kernel code. EINVAL means the Sentry has the
// family and the profile let the call through. ok is false for any other
// answer (the row cannot decide).
func sentrySocket(err error) (reached, ok bool) {
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EAFNOSUPPORT), errors.Is(err, unix.EPROTONOSUPPORT), errors.Is(err, unix.ESOCKTNOSUPPORT):
		return false, true
	case errors.Is(err, unix.EINVAL):
		return true, true
	}
	return false, false
}

// seccompMode is the Seccomp field of /proc/self/status ("" unknown).
func seccompMode() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Seccomp:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
