package homereset

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// A turn can use up every inode of its size-capped HOME, and ext4 keeps no
// inodes back for root the way it keeps blocks: the next reset could then
// not even write its journal, and the task would be stuck. So root holds a
// reserve of empty files in .shrooms (which the cage never sees), gives them
// back when a reset finds the filesystem out of inodes, and takes them again
// once the old tree is deleted.
const (
	reservePfx   = "reserve-"
	reserveCount = 256
)

// refillReserve creates the missing reserve files; running out of inodes
// while doing so is not an error (the next Cleanup tries again).
func refillReserve(meta *os.File) error {
	for i := 0; i < reserveCount; i++ {
		fd, err := unix.Openat(int(meta.Fd()), fmt.Sprintf("%s%03d", reservePfx, i), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		switch {
		case err == nil:
			unix.Close(fd)
		case errors.Is(err, unix.EEXIST):
		case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
			return nil
		default:
			return fmt.Errorf("HOME inode reserve: %w", err)
		}
	}
	return nil
}

// releaseReserveIfShort frees the reserve when fewer inodes are free than it
// holds, so that a reset has room to work.
func releaseReserveIfShort(meta *os.File) error {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(meta.Fd()), &fs); err != nil {
		return fmt.Errorf("HOME inode reserve: %w", err)
	}
	if fs.Files == 0 || fs.Ffree >= reserveCount {
		return nil // plenty, or a filesystem without an inode count
	}
	names, err := meta.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("HOME inode reserve: %w", err)
	}
	if _, err := meta.Seek(0, 0); err != nil {
		return fmt.Errorf("HOME inode reserve: %w", err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, reservePfx) {
			if err := unix.Unlinkat(int(meta.Fd()), n, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("HOME inode reserve: %w", err)
			}
		}
	}
	return nil
}
