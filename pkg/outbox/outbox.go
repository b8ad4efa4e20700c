// Package outbox is the cage's one sanctioned exit besides the worktree, and
// a one-way one. While a turn runs, /outbox is a fresh size-capped tmpfs
// (nosuid, nodev, noexec) that Mount puts at <root>/<task> in the mount
// namespace of the podman service, which is what the cage is given. When
// the turn ends, Settle moves its valid regular files into the task's
// pending deliveries, <root>/.pending/<task>/<turn>/ (files/ and the turn's
// manifest.json), and unmounts it: no later turn can read what an earlier
// one left there. List, Collect and Release work on the pending deliveries,
// which no cage ever sees. Every copy goes by content through pinned file
// descriptors, never by path, so nothing a hostile turn plants can make the
// host read, write, follow or block on anything outside the outbox.
package outbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/homestore"
	"github.com/shrooms-cage/shrooms/pkg/resolve"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// Limits bound the outbox mount, the move at a turn's end and one collect.
type Limits struct {
	Size          int64 // bytes of the tmpfs mounted at root/<task>
	Inodes        int64 // inodes of that tmpfs
	MaxFiles      int
	MaxTotalSize  int64
	MaxFileSize   int64
	MaxDepth      int // 1 = files directly in the outbox only
	MaxNameLength int // bytes per path component
	AllowExec     bool
	Timeout       time.Duration // bound of one move or collect
	MaxPending    int64         // bytes the pending deliveries may hold before a new outbox is refused
}

// LimitsFrom takes the limits of the [outbox] config section.
func LimitsFrom(c config.Outbox) Limits {
	return Limits{
		Size: int64(c.Size), Inodes: c.Inodes, MaxFiles: c.MaxFiles,
		MaxTotalSize: int64(c.MaxTotalSize), MaxFileSize: int64(c.MaxFileSize),
		MaxDepth: c.MaxDepth, MaxNameLength: c.MaxNameLength, AllowExec: c.AllowExec,
		Timeout: c.CollectTimeout.Std(), MaxPending: int64(c.MaxPending),
	}
}

// DefaultLimits are the built-in [outbox] limits.
func DefaultLimits() Limits { return LimitsFrom(config.Default().Outbox) }

// PendingDir is the directory under the outbox root that holds the pending
// deliveries, one directory per task, one per turn in it (a task id never
// starts with a dot).
const PendingDir = ".pending"

// errNoTask refuses the zero task id (only taskid.Parse makes one).
var errNoTask = errors.New("no task id")

// Pending is the directory of task's pending deliveries.
func Pending(root string, id taskid.ID) string {
	return filepath.Join(filepath.Clean(root), PendingDir, id.String())
}

// openRoot opens the outbox root (an absolute, admin-configured path) as an
// O_PATH directory, refusing a symbolic link in any component.
func openRoot(root string) (int, error) {
	if !filepath.IsAbs(root) || filepath.Clean(root) == "/" {
		return -1, fmt.Errorf("outbox root %q must be an absolute path other than /", root)
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, filepath.Clean(root), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: resolve.NoLinks,
	})
	if err != nil {
		return -1, fmt.Errorf("outbox root %s: %w", root, explain(err))
	}
	return fd, nil
}

// openTask opens root/task (flags added to O_DIRECTORY|O_NOFOLLOW), never
// through a symbolic link; crossing into the task's own mount is allowed.
func openTask(rootfd int, root string, id taskid.ID, flags uint64) (int, error) {
	task := id.String()
	fd, err := unix.Openat2(rootfd, task, &unix.OpenHow{
		Flags:   flags | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: resolve.BeneathAnyMount,
	})
	if errors.Is(err, unix.ENOENT) {
		return -1, fmt.Errorf("task %q has no outbox (%s does not exist): %w", task, filepath.Join(root, task), err)
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

// inNS runs fn in the mount namespace ns ("" is the caller's own).
func inNS(ns string, fn func() error) error {
	if ns == "" {
		return fn()
	}
	return homestore.InNamespace(ns, fn)
}

// namespaces are the namespaces an outbox operation visits: each given one
// (the podman service's) and the caller's own, last.
func namespaces(nss []string) []string {
	out := []string{}
	for _, ns := range nss {
		if ns != "" {
			out = append(out, ns)
		}
	}
	return append(out, "")
}

// checkMountArgs checks the outbox's limits and owner for Mount and Ready.
func checkMountArgs(uid, gid int, lim Limits) error {
	if lim.Size < 1<<20 || lim.Inodes < 16 {
		return fmt.Errorf("outbox limits: size must be at least 1m and inodes at least 16")
	}
	if uid < 0 || gid < 0 {
		return fmt.Errorf("outbox owner %d:%d is not a host uid:gid", uid, gid)
	}
	return nil
}

// Mount makes root/task the turn's outbox, ready to be bind-mounted at
// /outbox: a fresh tmpfs of lim.Size bytes and lim.Inodes inodes (nosuid,
// nodev, noexec, mode 0700) owned by uid:gid, the agent's host ids, mounted
// in the mount namespace ns (the podman service's; "" is the caller's own).
// root is created (0700) if missing. Settle must have run first: an outbox
// still mounted, or a directory that is not empty, is refused, so what one
// turn left is never handed to the next. A symbolic link planted at
// root/task is refused, never followed. It returns the tmpfs's device.
func Mount(root string, id taskid.ID, uid, gid int, lim Limits, ns string) (dev uint64, err error) {
	task := id.String()
	if id.IsZero() {
		return 0, errNoTask
	}
	if err := checkMountArgs(uid, gid, lim); err != nil {
		return 0, err
	}
	where := filepath.Join(filepath.Clean(root), task)
	err = inNS(ns, func() error {
		if err := os.MkdirAll(filepath.Clean(root), 0o700); err != nil {
			return fmt.Errorf("create outbox root: %w", err)
		}
		rootfd, err := openRoot(root)
		if err != nil {
			return err
		}
		defer unix.Close(rootfd)
		if err := unix.Mkdirat(rootfd, task, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create outbox %s: %w", where, err)
		}
		tfd, err := openTask(rootfd, root, id, unix.O_PATH)
		if err != nil {
			return err
		}
		defer unix.Close(tfd)
		if mounted, err := isOwnMount(rootfd, tfd); err != nil || mounted {
			if err == nil {
				err = fmt.Errorf("outbox %s is still mounted with an earlier turn's files that were not moved (refusing to hand them to this turn; `shrooms outbox release --task %s` discards them)", where, task)
			}
			return err
		}
		if err := checkEmpty(tfd, where, id); err != nil {
			return err
		}
		if err := checkPending(root, id, lim); err != nil {
			return err
		}
		// mount(2) on the magic link acts on the pinned directory itself, so
		// a rename or symlink swap after the open cannot redirect it.
		data := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d", lim.Size, lim.Inodes, uid, gid)
		if err := unix.Mount("shrooms-outbox", "/proc/thread-self/fd/"+strconv.Itoa(tfd), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, data); err != nil {
			return fmt.Errorf("mount size-capped tmpfs on outbox %s: %w", where, err)
		}
		dev, err = checkLive(rootfd, root, id, uid, gid, lim)
		if err != nil {
			_ = unix.Unmount("/proc/thread-self/fd/"+strconv.Itoa(tfd), unix.MNT_DETACH)
		}
		return err
	})
	if err != nil && ns != "" {
		err = fmt.Errorf("in the podman service's mount namespace: %w", err)
	}
	return dev, err
}

// checkEmpty refuses a directory that holds anything.
func checkEmpty(fd int, where string, id taskid.ID) error {
	task := id.String()
	names, err := readNames(fd)
	if err != nil {
		return fmt.Errorf("read outbox %s: %w", where, err)
	}
	if len(names) > 0 {
		return fmt.Errorf("outbox %s is not empty (it holds %q; refusing to hand it to this turn; `shrooms outbox release --task %s` discards it)", where, displayName(names[0]), task)
	}
	return nil
}

// checkLive verifies root/task is what a turn must be given: a tmpfs of its
// own, with the limits, owner and flags of lim, uid and gid. It returns the
// tmpfs's device.
func checkLive(rootfd int, root string, id taskid.ID, uid, gid int, lim Limits) (uint64, error) {
	task := id.String()
	where := filepath.Join(filepath.Clean(root), task)
	dfd, err := openTask(rootfd, root, id, unix.O_RDONLY)
	if err != nil {
		return 0, err
	}
	defer unix.Close(dfd)
	var rs, st unix.Stat_t
	var fs unix.Statfs_t
	if err := unix.Fstat(rootfd, &rs); err != nil {
		return 0, err
	}
	if err := unix.Fstat(dfd, &st); err != nil {
		return 0, err
	}
	if err := unix.Fstatfs(dfd, &fs); err != nil {
		return 0, err
	}
	page := int64(os.Getpagesize())
	want := (lim.Size + page - 1) / page * page
	switch {
	case fs.Type != unix.TMPFS_MAGIC || st.Dev == rs.Dev:
		return 0, fmt.Errorf("outbox %s is not a size-capped tmpfs of its own (refusing)", where)
	case fs.Flags&(unix.ST_NOSUID|unix.ST_NODEV|unix.ST_NOEXEC) != unix.ST_NOSUID|unix.ST_NODEV|unix.ST_NOEXEC:
		return 0, fmt.Errorf("outbox %s is not mounted nosuid,nodev,noexec (refusing)", where)
	case int64(fs.Blocks)*fs.Bsize != want || int64(fs.Files) != lim.Inodes:
		return 0, fmt.Errorf("outbox %s is not capped at outbox.size %d and outbox.inodes %d (it has %d bytes, %d inodes; refusing)", where, lim.Size, lim.Inodes, int64(fs.Blocks)*fs.Bsize, fs.Files)
	case st.Uid != uint32(uid) || st.Gid != uint32(gid) || st.Mode&0o7777 != 0o700:
		return 0, fmt.Errorf("outbox %s is not the agent's (%d:%d, mode 0700; it is %d:%d %o; refusing)", where, uid, gid, st.Uid, st.Gid, st.Mode&0o7777)
	}
	return st.Dev, nil
}

// Ready checks that root/task in the mount namespace ns is still the empty,
// capped tmpfs Mount made for a turn (device dev, when not 0): what a cage
// prepared ahead was given, and will find when it starts.
func Ready(root string, id taskid.ID, uid, gid int, lim Limits, ns string, dev uint64) error {
	task := id.String()
	if id.IsZero() {
		return errNoTask
	}
	if err := checkMountArgs(uid, gid, lim); err != nil {
		return err
	}
	where := filepath.Join(filepath.Clean(root), task)
	return inNS(ns, func() error {
		rootfd, err := openRoot(root)
		if err != nil {
			return err
		}
		defer unix.Close(rootfd)
		got, err := checkLive(rootfd, root, id, uid, gid, lim)
		if err != nil {
			return err
		}
		if dev != 0 && got != dev {
			return fmt.Errorf("outbox %s is another tmpfs than the one the prepared cage was given", where)
		}
		dfd, err := openTask(rootfd, root, id, unix.O_RDONLY)
		if err != nil {
			return err
		}
		defer unix.Close(dfd)
		return checkEmpty(dfd, where, id)
	})
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

// Release discards the task's outbox: the live tmpfs, wherever it is still
// mounted (each namespace in nss, then the caller's own), and every pending
// delivery. A missing outbox is not an error.
func Release(root string, id taskid.ID, nss ...string) error {
	task := id.String()
	if id.IsZero() {
		return errNoTask
	}
	for _, ns := range namespaces(nss) {
		if err := inNS(ns, func() error { return unmountLive(root, id) }); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(Pending(root, id)); err != nil {
		return fmt.Errorf("remove pending deliveries of %s: %w", task, err)
	}
	return nil
}

// unmountLive unmounts every tmpfs stacked at root/task and removes the
// then empty directory.
func unmountLive(root string, id taskid.ID) error {
	task := id.String()
	rootfd, err := openRoot(root)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(rootfd)
	where := filepath.Join(filepath.Clean(root), task)
	for i := 0; ; i++ {
		tfd, err := unix.Openat2(rootfd, task, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: resolve.BeneathAnyMount,
		})
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("outbox %s: %w", where, explain(err))
		}
		mounted, err := isOwnMount(rootfd, tfd)
		if err == nil && mounted {
			err = unix.Unmount("/proc/thread-self/fd/"+strconv.Itoa(tfd), unix.MNT_DETACH)
		}
		unix.Close(tfd)
		if err != nil {
			return fmt.Errorf("unmount outbox %s: %w", where, err)
		}
		if !mounted {
			break
		}
		if i >= 8 {
			return fmt.Errorf("unmount outbox %s: still mounted after 8 unmounts", where)
		}
	}
	err = unix.Unlinkat(rootfd, task, unix.AT_REMOVEDIR)
	if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
		// A bare directory holding files (a cage given it without its tmpfs):
		// moved out of the cages' reach first, then removed.
		var q string
		if q, err = quarantine(rootfd, root, id, "discard"); err == nil {
			err = os.RemoveAll(q)
		}
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove outbox %s: %w", where, err)
	}
	return nil
}

// openPending opens (creating them, 0700) root/.pending and its task
// directory as an O_PATH directory, through no symbolic link.
func openPending(rootfd int, root string, id taskid.ID) (int, error) {
	task := id.String()
	fd := rootfd
	for _, name := range []string{PendingDir, task} {
		if err := unix.Mkdirat(fd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("create pending deliveries %s: %w", Pending(root, id), err)
		}
		nfd, err := unix.Openat2(fd, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolve.Beneath})
		if fd != rootfd {
			unix.Close(fd)
		}
		if err != nil {
			return -1, fmt.Errorf("pending deliveries %s: %w", Pending(root, id), explain(err))
		}
		fd = nfd
	}
	return fd, nil
}

// quarantine renames the bare directory root/task into the task's pending
// directory as .<kind>-<time> (no cage sees it there), puts an empty
// directory in its place and returns the quarantined path.
func quarantine(rootfd int, root string, id taskid.ID, kind string) (string, error) {
	task := id.String()
	pfd, err := openPending(rootfd, root, id)
	if err != nil {
		return "", err
	}
	defer unix.Close(pfd)
	name := fmt.Sprintf(".%s-%d", kind, time.Now().UnixNano())
	if err := unix.Renameat2(rootfd, task, pfd, name, unix.RENAME_NOREPLACE); err != nil {
		return "", fmt.Errorf("move outbox %s aside: %w", filepath.Join(root, task), err)
	}
	if err := unix.Mkdirat(rootfd, task, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return "", fmt.Errorf("create outbox %s: %w", filepath.Join(root, task), err)
	}
	return filepath.Join(Pending(root, id), name), nil
}

// checkPending refuses a new outbox while the task's pending deliveries
// hold more than lim.MaxPending bytes (0: no cap), so a run of turns cannot
// fill the host's disk through the outbox.
func checkPending(root string, id taskid.ID, lim Limits) error {
	task := id.String()
	if lim.MaxPending <= 0 {
		return nil
	}
	n, err := pendingBytes(Pending(root, id))
	if err != nil {
		return err
	}
	if n > lim.MaxPending {
		return fmt.Errorf("the pending deliveries of earlier turns hold %d bytes, over outbox.max_pending (%d): collect them (`shrooms outbox collect --task %s`) or release them (`shrooms outbox release --task %s`)", n, lim.MaxPending, task, task)
	}
	return nil
}

// pendingBytes adds up the sizes of the regular files below dir (written by
// shrooms' own move, never by a cage; links are not followed).
func pendingBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		n += info.Size()
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("measure the pending deliveries: %w", err)
	}
	return n, nil
}
