package gateway

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// ListenInNetNS opens a TCP listener on addr inside the network namespace
// at nsPath (e.g. /proc/PID/ns/net of a cage's process). The socket keeps
// its namespace after the thread that made it leaves: the gateway serves
// from the host while only the cage can connect. The thread never returns
// to the Go scheduler in the cage's namespace: if it cannot switch back it
// stays locked and ends with its goroutine.
func ListenInNetNS(nsPath, addr string) (net.Listener, error) {
	target, err := os.Open(nsPath)
	if err != nil {
		return nil, fmt.Errorf("gateway: open network namespace: %w", err)
	}
	defer target.Close()
	type result struct {
		ln  net.Listener
		err error
	}
	c := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			c <- result{err: fmt.Errorf("gateway: own network namespace: %w", err)}
			return
		}
		defer self.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			c <- result{err: fmt.Errorf("gateway: enter the cage's network namespace: %w", err)}
			return
		}
		var ln net.Listener
		lerr := loopbackUp()
		if lerr == nil {
			ln, lerr = (&net.ListenConfig{}).Listen(context.Background(), "tcp", addr)
		}
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			if ln != nil {
				ln.Close()
			}
			c <- result{err: fmt.Errorf("gateway: leave the cage's network namespace: %w", err)}
			return
		}
		runtime.UnlockOSThread()
		if lerr != nil {
			lerr = fmt.Errorf("gateway: listen in the cage: %w", lerr)
		}
		c <- result{ln, lerr}
	}()
	r := <-c
	return r.ln, r.err
}

// loopbackUp sets the namespace's lo up. Podman leaves it down in the
// network-none namespace it gives a runsc cage, and gVisor's network=host
// then fails every connect to 127.0.0.1 with ENETUNREACH (docs/gvisor.md);
// under runc it is already up and this changes nothing.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("gateway: loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("gateway: loopback: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("gateway: loopback flags: %w", err)
	}
	flags := ifr.Uint16()
	if flags&unix.IFF_UP != 0 {
		return nil
	}
	ifr.SetUint16(flags | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("gateway: set loopback up: %w", err)
	}
	return nil
}
