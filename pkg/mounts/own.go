package mounts

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/shrooms-cage/shrooms/pkg/resolve"
	"golang.org/x/sys/unix"
)

// OwnWorktree gives the worktree to the task's agent (host uid, gid) so the
// cage's non-root user can write it, when its root is not already theirs.
// The git metadata (.git) is left as it is: root-owned, the cage cannot
// write it. So are nested git repositories (nested.go): the cage cannot
// change the owner's in place. It reports whether it changed anything.
//
// The walk is GiveBack's: relative to descriptors, directories opened with
// openat2 beneath the worktree, never following a symbolic link nor
// leaving the worktree's filesystem, every other entry changed with
// fchownat(AT_SYMLINK_NOFOLLOW), so nothing is resolved by path twice and
// no FIFO or device is opened. It runs before the task's cage starts,
// under the task lock, so no cage of the task writes the tree meanwhile;
// an entry the host replaces under the walk is left alone.
func OwnWorktree(dir string, uid, gid int) (bool, error) {
	h, err := NewHandOver(dir, uid, gid)
	if err != nil || h == nil {
		return false, err
	}
	defer h.Close()
	if err := h.walk(h.fd, 0); err != nil {
		return true, fmt.Errorf("worktree %s: give it to the task's user: %w", dir, err)
	}
	return true, nil
}

// HandOver is OwnWorktree one entry at a time, for a walk that also takes
// the worktree's change snapshot (diff.ScanHook): the root is handed
// over by NewHandOver, each entry below by Entry.
type HandOver struct {
	fd       int
	uid, gid int
	dev      uint64
}

// NewHandOver opens the worktree dir and gives its root to uid:gid; it
// returns nil when the root is theirs already (nothing to hand over).
func NewHandOver(dir string, uid, gid int) (*HandOver, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("worktree %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("worktree %s: %w", dir, err)
	}
	if int(st.Uid) == uid && int(st.Gid) == gid {
		unix.Close(fd)
		return nil, nil
	}
	if err := unix.Fchown(fd, uid, gid); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("worktree %s: give it to the task's user: %w", dir, err)
	}
	return &HandOver{fd: fd, uid: uid, gid: gid, dev: st.Dev}, nil
}

// Close releases the worktree's descriptor.
func (o *HandOver) Close() error { return unix.Close(o.fd) }

// walk hands over the entries of the open directory fd (which it does not
// close), descending into subdirectories.
func (o *HandOver) walk(fd, depth int) error {
	if depth > maxGiveBackDepth {
		return fmt.Errorf("directories nested deeper than %d levels", maxGiveBackDepth)
	}
	rfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(rfd), ".")
	defer f.Close()
	for {
		names, err := f.Readdirnames(1024)
		for _, name := range names {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue
				}
				return fmt.Errorf("stat %s: %w", name, err)
			}
			if err := o.descend(fd, name, depth, &st); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(names) == 0) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func (o *HandOver) descend(fd int, name string, depth int, st *unix.Stat_t) error {
	_, child, err := o.entry(fd, name, st)
	if err != nil || child < 0 {
		return err
	}
	defer unix.Close(child)
	if err := o.walk(child, depth+1); err != nil {
		return fmt.Errorf("%s/%w", name, err)
	}
	return nil
}

// Entry hands over the entry name of the directory dirFd (rel below the
// worktree root), which st (its lstat) describes. It reports whether it changed the entry, and whether
// what lies below it is to be handed over too (a directory of the
// worktree's own filesystem that is no git repository).
func (o *HandOver) Entry(dirFd int, name, _ string, st *unix.Stat_t) (changed, below bool, err error) {
	changed, child, err := o.entry(dirFd, name, st)
	if child >= 0 {
		unix.Close(child)
	}
	return changed, child >= 0, err
}

// entry is Entry that returns the directory it handed over, open (-1 for
// none), for the walk to descend into.
func (o *HandOver) entry(fd int, name string, st *unix.Stat_t) (bool, int, error) {
	if name == ".git" {
		// The root's own stays root's (a directory, or a linked
		// worktree's gitdir pointer); a nested one stays its owner's.
		return false, -1, nil
	}
	if st.Dev != o.dev {
		return false, -1, nil // another filesystem mounted inside: not ours to change
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		err := unix.Fchownat(fd, name, o.uid, o.gid, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			return false, -1, nil
		}
		if err != nil {
			return false, -1, fmt.Errorf("chown %s: %w", name, err)
		}
		return true, -1, nil
	}
	child, err := unix.Openat2(fd, name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: resolve.Beneath,
	})
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EXDEV):
		return false, -1, nil // replaced under the walk, or a mount point: never followed
	case err != nil:
		return false, -1, fmt.Errorf("open %s: %w", name, err)
	}
	var cst unix.Stat_t
	if err := unix.Fstat(child, &cst); err != nil {
		unix.Close(child)
		return false, -1, fmt.Errorf("stat %s: %w", name, err)
	}
	if cst.Dev != st.Dev || cst.Ino != st.Ino || looksLikeGitDir(child) {
		// Replaced under the walk, or the owner's nested repository,
		// which stays the owner's (nested.go).
		unix.Close(child)
		return false, -1, nil
	}
	if err := unix.Fchown(child, o.uid, o.gid); err != nil {
		unix.Close(child)
		return false, -1, fmt.Errorf("chown %s: %w", name, err)
	}
	return true, child, nil
}
