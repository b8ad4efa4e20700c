// Package outbox is the cage's one sanctioned exit besides the worktree: a
// per-task host directory, mounted read-write at /outbox, that is a
// size-capped tmpfs while turns run, and that `collect` empties into a
// delivery directory by copying regular files through pinned file
// descriptors, never by path, so nothing a hostile turn plants there can make
// the host read, write, follow or block on anything outside it.
package outbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// Limits bound the outbox mount and one collect.
type Limits struct {
	Size          int64 // bytes of the tmpfs mounted at root/<task>
	Inodes        int64 // inodes of that tmpfs
	MaxFiles      int
	MaxTotalSize  int64
	MaxFileSize   int64
	MaxDepth      int // 1 = files directly in the outbox only
	MaxNameLength int // bytes per path component
	AllowExec     bool
	Timeout       time.Duration // bound of one collect
}

// LimitsFrom takes the limits of the [outbox] config section.
func LimitsFrom(c config.Outbox) Limits {
	return Limits{
		Size: int64(c.Size), Inodes: c.Inodes, MaxFiles: c.MaxFiles,
		MaxTotalSize: int64(c.MaxTotalSize), MaxFileSize: int64(c.MaxFileSize),
		MaxDepth: c.MaxDepth, MaxNameLength: c.MaxNameLength, AllowExec: c.AllowExec,
		Timeout: c.CollectTimeout.Std(),
	}
}

// DefaultLimits are the built-in [outbox] limits.
func DefaultLimits() Limits { return LimitsFrom(config.Default().Outbox) }

// resolveIn is how every path below a pinned directory is resolved: never
// above it, through no symbolic link, magic link or mount point.
const resolveIn = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// openRoot opens the outbox root (an absolute, admin-configured path) as an
// O_PATH directory, refusing a symbolic link in any component.
func openRoot(root string) (int, error) {
	if !filepath.IsAbs(root) || filepath.Clean(root) == "/" {
		return -1, fmt.Errorf("outbox root %q must be an absolute path other than /", root)
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, filepath.Clean(root), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, fmt.Errorf("outbox root %s: %w", root, explain(err))
	}
	return fd, nil
}

// openTask opens root/task (flags added to O_DIRECTORY|O_NOFOLLOW), never
// through a symbolic link; crossing into the task's own mount is allowed.
func openTask(rootfd int, root, task string, flags uint64) (int, error) {
	fd, err := unix.Openat2(rootfd, task, &unix.OpenHow{
		Flags:   flags | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOENT) {
		return -1, fmt.Errorf("task %q has no outbox (%s does not exist)", task, filepath.Join(root, task))
	}
	if err != nil {
		var st unix.Stat_t
		if unix.Fstatat(rootfd, task, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return -1, fmt.Errorf("outbox %s is a symbolic link (refused, not followed)", filepath.Join(root, task))
		}
		return -1, fmt.Errorf("outbox %s: %w", filepath.Join(root, task), explain(err))
	}
	return fd, nil
}

func explain(err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("a path component is a symbolic link (refused): %w", err)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("not a directory: %w", err)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("crosses a mount point (refused): %w", err)
	}
	return err
}

// Prepare makes root/task the task's outbox, ready to be bind-mounted at
// /outbox: a tmpfs of lim.Size bytes and lim.Inodes inodes (nosuid, nodev,
// noexec, mode 0700) owned by uid:gid, the agent's host ids. root is created
// (0700) if missing. A symbolic link planted at root/task is refused, never
// followed. If root/task is already such a tmpfs (an earlier turn's outbox
// not yet collected), its contents are kept and its limits and owner are
// re-applied. It returns the host path of the outbox.
func Prepare(root, task string, uid, gid int, lim Limits) (string, error) {
	if _, err := taskid.Parse(task); err != nil {
		return "", err
	}
	if lim.Size < 1<<20 || lim.Inodes < 16 {
		return "", fmt.Errorf("outbox limits: size must be at least 1m and inodes at least 16")
	}
	if uid < 0 || gid < 0 {
		return "", fmt.Errorf("outbox owner %d:%d is not a host uid:gid", uid, gid)
	}
	if err := os.MkdirAll(filepath.Clean(root), 0o700); err != nil {
		return "", fmt.Errorf("create outbox root: %w", err)
	}
	rootfd, err := openRoot(root)
	if err != nil {
		return "", err
	}
	defer unix.Close(rootfd)
	if err := unix.Mkdirat(rootfd, task, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return "", fmt.Errorf("create outbox %s: %w", filepath.Join(root, task), err)
	}
	tfd, err := openTask(rootfd, root, task, unix.O_PATH)
	if err != nil {
		return "", err
	}
	defer unix.Close(tfd)
	mounted, err := isOwnMount(rootfd, tfd)
	if err != nil {
		return "", err
	}
	// mount(2) on /proc/self/fd/N acts on the pinned directory itself, so a
	// rename or symlink swap after the open cannot redirect it.
	target := "/proc/self/fd/" + strconv.Itoa(tfd)
	data := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d", lim.Size, lim.Inodes, uid, gid)
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if mounted {
		err = unix.Mount("", target, "", flags|unix.MS_REMOUNT, data)
	} else {
		err = unix.Mount("shrooms-outbox", target, "tmpfs", flags, data)
	}
	if err != nil {
		return "", fmt.Errorf("mount size-capped tmpfs on outbox %s: %w", filepath.Join(root, task), err)
	}
	// Reopen through the new mount and check what the cage will get.
	dfd, err := openTask(rootfd, root, task, unix.O_RDONLY)
	if err != nil {
		return "", err
	}
	defer unix.Close(dfd)
	if err := unix.Mount("", "/proc/self/fd/"+strconv.Itoa(dfd), "", unix.MS_PRIVATE, ""); err != nil {
		return "", fmt.Errorf("make outbox mount private: %w", err)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(dfd, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		return "", fmt.Errorf("outbox %s is not the size-capped tmpfs after mounting (refusing)", filepath.Join(root, task))
	}
	if err := unix.Fchown(dfd, uid, gid); err != nil {
		return "", fmt.Errorf("chown outbox: %w", err)
	}
	if err := unix.Fchmod(dfd, 0o700); err != nil {
		return "", fmt.Errorf("chmod outbox: %w", err)
	}
	return filepath.Join(filepath.Clean(root), task), nil
}

// isOwnMount reports whether the pinned task directory is a tmpfs mount of
// its own (a different device than the root directory).
func isOwnMount(rootfd, tfd int) (bool, error) {
	var rs, ts unix.Stat_t
	if err := unix.Fstat(rootfd, &rs); err != nil {
		return false, err
	}
	if err := unix.Fstat(tfd, &ts); err != nil {
		return false, err
	}
	if rs.Dev == ts.Dev {
		return false, nil
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(tfd, &fs); err != nil {
		return false, err
	}
	if fs.Type != unix.TMPFS_MAGIC {
		return false, fmt.Errorf("outbox is a mount point of another kind than tmpfs (refusing)")
	}
	return true, nil
}

// Release unmounts the task's outbox tmpfs, discarding whatever it still
// holds, and removes the empty directory. A missing outbox is not an error.
func Release(root, task string) error {
	if _, err := taskid.Parse(task); err != nil {
		return err
	}
	rootfd, err := openRoot(root)
	if err != nil {
		return err
	}
	defer unix.Close(rootfd)
	tfd, err := unix.Openat2(rootfd, task, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("outbox %s: %w", filepath.Join(root, task), explain(err))
	}
	mounted, err := isOwnMount(rootfd, tfd)
	if err == nil && mounted {
		err = unix.Unmount("/proc/self/fd/"+strconv.Itoa(tfd), unix.MNT_DETACH)
	}
	unix.Close(tfd)
	if err != nil {
		return fmt.Errorf("unmount outbox %s: %w", filepath.Join(root, task), err)
	}
	if err := unix.Unlinkat(rootfd, task, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove outbox %s: %w", filepath.Join(root, task), err)
	}
	return nil
}
