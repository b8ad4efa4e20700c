package podmanpeer

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Pid returns the pid of the process listening on the unix socket of url
// (unix:///path), from SO_PEERCRED of a connection: 0 when it is not a
// process of this pid namespace.
func Pid(url string) (int, error) {
	path, ok := strings.CutPrefix(url, "unix://")
	if !ok || path == "" {
		return 0, fmt.Errorf("podman service: %s is not a unix socket", url)
	}
	conn, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return 0, fmt.Errorf("podman service: %w", err)
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("podman service: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return 0, fmt.Errorf("podman service: SO_PEERCRED: %w", errors.Join(err, cerr))
	}
	return int(cred.Pid), nil
}

// MountNS returns a descriptor of the mount namespace of the process pid,
// or -1 when it is this thread's own.
func MountNS(pid int) (int, error) {
	var ours, theirs unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/mnt", &ours); err != nil {
		return -1, fmt.Errorf("own mount namespace: %w", err)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("podman service's mount namespace: %w", err)
	}
	if err := unix.Fstat(fd, &theirs); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("podman service's mount namespace: %w", err)
	}
	if theirs.Dev == ours.Dev && theirs.Ino == ours.Ino {
		unix.Close(fd)
		return -1, nil
	}
	return fd, nil
}

// InMountNS runs fn in the mount namespace of the process pid: on this
// thread when it is shrooms' own, else on a thread of its own that joins
// it (a thread with its own filesystem context may; it is never used
// again, so nothing else runs in that namespace). Never on the main
// thread: the runtime cannot end that one, it would stay in the joined
// namespace, and /proc/self (the namespaces teardownd's key reads, the
// mountinfo wtcap reads) would name that namespace from then on.
func InMountNS(pid int, fn func() error) error {
	ns, err := MountNS(pid)
	if err != nil {
		return err
	}
	if ns < 0 {
		return fn()
	}
	defer unix.Close(ns)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() != unix.Getpid() {
			joinAndRun(ns, fn, done) // this thread ends with the goroutine
			return
		}
		// The main thread, held here so that the goroutine below gets
		// another one.
		inner := make(chan error, 1)
		go joinAndRun(ns, fn, inner)
		done <- <-inner
		runtime.UnlockOSThread()
	}()
	return <-done
}

// joinAndRun locks its goroutine to its thread for good, gives the thread
// its own filesystem context, joins the mount namespace ns and runs fn.
func joinAndRun(ns int, fn func() error, done chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
	if unix.Gettid() == unix.Getpid() {
		done <- errors.New("join the podman service's mount namespace: refusing to move the main thread")
		return
	}
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		done <- fmt.Errorf("unshare: %w", err)
		return
	}
	if err := unix.Setns(ns, unix.CLONE_NEWNS); err != nil {
		done <- fmt.Errorf("join the podman service's mount namespace: %w", err)
		return
	}
	done <- fn()
}
