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
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return false, fmt.Errorf("worktree %s: %w", dir, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, fmt.Errorf("worktree %s: %w", dir, err)
	}
	if int(st.Uid) == uid && int(st.Gid) == gid {
		return false, nil
	}
	o := &handOver{uid: uid, gid: gid, dev: st.Dev}
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return true, fmt.Errorf("worktree %s: give it to the task's user: %w", dir, err)
	}
	if err := o.dir(fd, 0); err != nil {
		return true, fmt.Errorf("worktree %s: give it to the task's user: %w", dir, err)
	}
	return true, nil
}

type handOver struct {
	uid, gid int
	dev      uint64
}

// dir hands over the entries of the open directory fd (which it does not
// close), descending into subdirectories.
func (o *handOver) dir(fd, depth int) error {
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
			if err := o.entry(fd, name, depth); err != nil {
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

func (o *handOver) entry(fd int, name string, depth int) error {
	if name == ".git" {
		// The root's own stays root's (a directory, or a linked
		// worktree's gitdir pointer); a nested one stays its owner's.
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("stat %s: %w", name, err)
	}
	if st.Dev != o.dev {
		return nil // another filesystem mounted inside: not ours to change
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Fchownat(fd, name, o.uid, o.gid, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("chown %s: %w", name, err)
		}
		return nil
	}
	child, err := unix.Openat2(fd, name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: resolve.Beneath,
	})
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EXDEV):
		return nil // replaced under the walk: never followed
	case err != nil:
		return fmt.Errorf("open %s: %w", name, err)
	}
	defer unix.Close(child)
	var cst unix.Stat_t
	if err := unix.Fstat(child, &cst); err != nil {
		return fmt.Errorf("stat %s: %w", name, err)
	}
	if cst.Dev != st.Dev || cst.Ino != st.Ino {
		return nil
	}
	if looksLikeGitDir(child) {
		return nil // the owner's nested repository stays the owner's (nested.go)
	}
	if err := unix.Fchown(child, o.uid, o.gid); err != nil {
		return fmt.Errorf("chown %s: %w", name, err)
	}
	if err := o.dir(child, depth+1); err != nil {
		return fmt.Errorf("%s/%w", name, err)
	}
	return nil
}
