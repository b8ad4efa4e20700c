package cagenet

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/podmanpeer"
)

// NetnsDir is where a rootful podman binds each container's network
// namespace (netns-…), in the podman service's mount namespace.
const NetnsDir = "/run/netns"

// NetnsFix is what an owner runs when shrooms cannot share NetnsDir itself.
const NetnsFix = "as root: nsenter -t PID -m sh -c 'mkdir -p /run/netns && { mount --make-rshared /run/netns || { mount --rbind /run/netns /run/netns && mount --make-rshared /run/netns; }; }' (PID: the podman service's), or run the service under systemd (/ shared)"

// Netns is what NetnsShared found.
type Netns struct {
	// Pid is the podman service's.
	Pid int
	// Shared is true when NetnsDir is a shared mount in its namespace.
	Shared bool
}

// NetnsShared reads the podman service's mountinfo: is NetnsDir a shared
// mount there? A cage has a user namespace, so podman 4.3 binds its netns
// under NetnsDir after the cage's conmon made a mount namespace of its own
// (setupNetNS), and unlike netns.NewNS it does not make NetnsDir shared
// first: where it is not, the exit command cannot open the netns and the
// cage's network (veth, IPAM address, the netns mount) is never torn down.
func NetnsShared(socket string) (Netns, error) {
	pid, err := podmanpeer.Pid(socket)
	if err != nil {
		return Netns{}, err
	}
	if pid == 0 {
		return Netns{}, fmt.Errorf("the podman service at %s is not a process of this pid namespace: %s in its mount namespace cannot be checked", socket, NetnsDir)
	}
	shared, err := mountShared(fmt.Sprintf("/proc/%d/mountinfo", pid), NetnsDir)
	if err != nil {
		return Netns{Pid: pid}, err
	}
	return Netns{Pid: pid, Shared: shared}, nil
}

// ServiceNetns is ShareNetns as a turn's step (turn.NetnsSharer).
type ServiceNetns struct{}

// Share is ShareNetns(socket).
func (ServiceNetns) Share(socket string) error { return ShareNetns(socket) }

// ShareNetns makes sure NetnsDir is a shared mount in the podman service's
// mount namespace before a networked cage is created, as podman's
// netns.NewNS does (mkdir 0755, make-rshared; on EINVAL, not a mount point,
// rbind it on itself first), and verifies it from the mountinfo. Shared
// already (the common case) costs one mountinfo read; an error means the
// cage must not be created.
func ShareNetns(socket string) error {
	st, err := NetnsShared(socket)
	if err != nil {
		return netnsRefusal(st.Pid, err)
	}
	if st.Shared {
		return nil
	}
	if err := podmanpeer.InMountNS(st.Pid, shareNetnsHere); err != nil {
		return netnsRefusal(st.Pid, err)
	}
	shared, err := mountShared(fmt.Sprintf("/proc/%d/mountinfo", st.Pid), NetnsDir)
	if err == nil && !shared {
		err = errors.New("still not shared after mount --make-rshared")
	}
	if err != nil {
		return netnsRefusal(st.Pid, err)
	}
	return nil
}

func netnsRefusal(pid int, err error) error {
	fix := NetnsFix
	if pid > 0 {
		fix = strings.Replace(strings.Replace(fix, " (PID: the podman service's)", "", 1), "-t PID", fmt.Sprintf("-t %d", pid), 1)
	}
	return fmt.Errorf("%s in the podman service's mount namespace is not a shared mount and cannot be made one (%w): podman would never tear down the cage's network (its address pool runs out after ~250 turns); fix: %s", NetnsDir, err, fix)
}

// shareNetnsHere makes NetnsDir a shared mount in this thread's mount
// namespace.
func shareNetnsHere() error {
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", NetnsDir, err)
	}
	err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("mount --rbind %s %s: %w", NetnsDir, NetnsDir, err)
		}
		err = unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("mount --make-rshared %s: %w", NetnsDir, err)
	}
	return nil
}

// mountShared says whether the topmost mount at dir in the mountinfo file
// is shared (a "shared:N" optional field); false when dir is no mount point.
func mountShared(mountinfoPath, dir string) (bool, error) {
	f, err := os.Open(mountinfoPath)
	if err != nil {
		return false, fmt.Errorf("podman service's mounts: %w", err)
	}
	defer f.Close()
	at, err := mountinfo.GetMountsFromReader(f, func(m *mountinfo.Info) (skip, stop bool) {
		return m.Mountpoint != dir, false
	})
	if err != nil {
		return false, fmt.Errorf("podman service's mounts: %w", err)
	}
	if len(at) == 0 {
		return false, nil
	}
	// A later mount on the same point covers an earlier one.
	for _, opt := range strings.Fields(at[len(at)-1].Optional) {
		if strings.HasPrefix(opt, "shared:") {
			return true, nil
		}
	}
	return false, nil
}
