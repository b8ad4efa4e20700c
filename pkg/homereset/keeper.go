package homereset

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// keeper is the owner of a task root and its .shrooms/: the user running
// the reset. On a host that is root, so the cage's (mapped) user can never
// own them. In a Kubernetes init container the reset runs as the agent's
// own uid with no capabilities; there the agent is kept away from .shrooms/
// by its mount (a subPath of home/ only), not by ownership.
func keeper() (uid, gid int) { return os.Geteuid(), os.Getegid() }

// ownDirWritable makes a directory the keeper owns searchable and writable
// again, for a keeper without CAP_DAC_OVERRIDE: an agent can chmod its own
// directories to 0 and so keep an unprivileged reset from emptying them.
// It reports whether it changed anything (never for root, which has no need,
// or for a directory someone else owns).
func ownDirWritable(dir *os.File, name string) bool {
	if os.Geteuid() == 0 {
		return false
	}
	fd, st, err := openNode(dir, name)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() || st.Mode&0o700 == 0o700 {
		return false
	}
	// Through the O_PATH descriptor: exactly the inode just checked.
	return unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), 0o700) == nil
}
