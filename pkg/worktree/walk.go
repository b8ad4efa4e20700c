package worktree

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/shrooms-cage/shrooms/pkg/resolve"
	"golang.org/x/sys/unix"
)

// maxDepth bounds the directory nesting a walk descends (one open
// descriptor per level).
const maxDepth = 4096

// The one walk of the hand-over (the worktree to the task's user before a
// turn) and the give-back (back to its owner after it). It is relative to
// descriptors: directories are opened with openat2 and resolve.Beneath
// (RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV|RESOLVE_NO_MAGICLINKS),
// so no symbolic link is followed and the walk never leaves the worktree or
// its filesystem; every other entry is changed with
// fchownat(AT_SYMLINK_NOFOLLOW) (lchown semantics: a link itself, never its
// target), so FIFOs, sockets and devices are never opened, and nothing is
// resolved by path twice. An entry replaced while the walk runs is skipped,
// never followed. The kernel clears setuid/setgid bits of files it chowns.
// The two directions differ only in what they change:
//
//   - the hand-over gives everything of the worktree's filesystem to the
//     task's user, directories before what lies below them, but git
//     metadata: the root's .git stays root's and the owner's nested
//     repositories stay the owner's (nested.go);
//   - the give-back changes only what the task's uid range [lo, hi) owns,
//     directories after what lies below them, walks the root's .git and
//     leaves nested repositories with the task's uid (keep).
type walker struct {
	uid, gid int    // the new owner
	dev      uint64 // the worktree's filesystem: the walk never leaves it
	giveBack bool
	lo, hi   uint32 // the give-back's task range
	rep      GiveBackReport
}

// changes reports whether the walk changes an entry the host uid owns.
func (w *walker) changes(uid uint32) bool {
	return !w.giveBack || (uid >= w.lo && uid < w.hi)
}

// openDir is a directory of the walk, open, with its fstat.
type openDir struct {
	fd int
	st unix.Stat_t
}

// walk changes the entries of the open directory fd (rel below the root,
// depth levels down; the caller closes fd), descending into
// subdirectories.
func (w *walker) walk(fd int, rel string, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("directories nested deeper than %d levels", maxDepth)
	}
	return eachName(fd, func(name string) error { return w.visit(fd, name, rel, depth) })
}

// eachName calls fn with every entry name of the open directory fd, read
// through a second descriptor so that fd stays usable for *at calls.
func eachName(fd int, fn func(name string) error) error {
	rfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(rfd), ".")
	defer f.Close()
	for {
		names, err := f.Readdirnames(1024)
		for _, name := range names {
			if err := fn(name); err != nil {
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

// visit changes the entry name of directory fd (dirRel below the root)
// and what lies below it.
func (w *walker) visit(fd int, name, dirRel string, depth int) error {
	var st unix.Stat_t
	if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			w.rep.Skipped++
			return nil
		}
		return fmt.Errorf("stat %s: %w", name, err)
	}
	_, sub, err := w.entry(fd, name, dirRel, depth, &st)
	if err != nil || sub == nil {
		return err
	}
	defer unix.Close(sub.fd)
	if err := w.walk(sub.fd, joinRel(dirRel, name), depth+1); err != nil {
		return fmt.Errorf("%s/%w", name, err)
	}
	_, err = w.leave(sub, name)
	return err
}

// entry changes the entry name of directory fd (dirRel below the root,
// depth levels down), which st (its lstat) describes. It reports whether it
// changed the entry, and returns the directory to descend into, open (nil
// for none: not a directory, another filesystem, a git directory, or
// replaced under the walk).
func (w *walker) entry(fd int, name, dirRel string, depth int, st *unix.Stat_t) (bool, *openDir, error) {
	if st.Dev != w.dev {
		return false, nil, nil // another filesystem mounted inside: not ours to change
	}
	if name == ".git" && (depth > 0 || !w.giveBack) {
		// The hand-over leaves the root's own .git root's (a directory, or
		// a linked worktree's gitdir pointer) and a nested one its
		// owner's; the give-back leaves a nested one the task's.
		if !w.giveBack {
			return false, nil, nil
		}
		return false, nil, w.keep(fd, name, joinRel(dirRel, name), st)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if !w.changes(st.Uid) {
			return false, nil, nil
		}
		err := unix.Fchownat(fd, name, w.uid, w.gid, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			w.rep.Skipped++
			return false, nil, nil
		}
		if err != nil {
			return false, nil, fmt.Errorf("chown %s: %w", name, err)
		}
		w.rep.Changed++
		return true, nil, nil
	}
	d, err := openBeneath(fd, name, st)
	if err != nil || d == nil {
		if d == nil && err == nil {
			w.rep.Skipped++ // replaced under the walk, or a mount point: never followed
		}
		return false, nil, err
	}
	if looksLikeGitDir(d.fd) && !(depth == 0 && name == ".git") {
		// A repository laid out below the root (nested.go).
		unix.Close(d.fd)
		if !w.giveBack {
			return false, nil, nil
		}
		return false, nil, w.keep(fd, name, joinRel(dirRel, name), &d.st)
	}
	if !w.giveBack {
		if err := unix.Fchown(d.fd, w.uid, w.gid); err != nil {
			unix.Close(d.fd)
			return false, nil, fmt.Errorf("chown %s: %w", name, err)
		}
		w.rep.Changed++
		return true, d, nil
	}
	return false, d, nil
}

// leave finishes the directory d (the entry name) once what lies below it
// is done: the give-back changes it then. It reports whether it did.
func (w *walker) leave(d *openDir, name string) (bool, error) {
	if !w.giveBack || !w.changes(d.st.Uid) {
		return false, nil
	}
	if err := unix.Fchown(d.fd, w.uid, w.gid); err != nil {
		return false, fmt.Errorf("chown %s: %w", name, err)
	}
	w.rep.Changed++
	return true, nil
}

// openBeneath opens the directory name of fd, which st (its lstat)
// describes, beneath fd; nil (and no error) when it is no longer that
// directory: replaced under the walk, a link, or a mount point.
func openBeneath(fd int, name string, st *unix.Stat_t) (*openDir, error) {
	child, err := unix.Openat2(fd, name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: resolve.Beneath,
	})
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EXDEV):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	d := &openDir{fd: child}
	if err := unix.Fstat(child, &d.st); err != nil {
		unix.Close(child)
		return nil, fmt.Errorf("stat %s: %w", name, err)
	}
	if d.st.Dev != st.Dev || d.st.Ino != st.Ino {
		unix.Close(child)
		return nil, nil
	}
	return d, nil
}

// openRoot opens the worktree dir for a walk (never through a link).
func openRoot(dir string) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, st, err
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, err
	}
	return fd, st, nil
}

// Hook is the walk one entry at a time, for the change scan's walk
// (diff.ScanHook before a turn with the hand-over, diff.ScanThenHook after
// it with the give-back): the same decisions per entry, a directory changed
// before what lies below it, the root by the constructor (hand-over) or by
// Finish (give-back). A scan that stopped short of the whole tree (its
// bounds) must be followed by the whole walk.
type Hook struct {
	fd      int
	rootUID uint32
	w       *walker
}

// Entry changes the entry name of the directory dirFd (rel below the
// worktree root, never the root's own .git), which st describes. It
// reports whether it changed the entry and whether what lies below it is
// to be changed too (a directory of the worktree's filesystem that is no
// git repository).
func (h *Hook) Entry(dirFd int, name, rel string, st *unix.Stat_t) (changed, below bool, err error) {
	dirRel := strings.TrimSuffix(strings.TrimSuffix(rel, name), "/")
	changed, d, err := h.w.entry(dirFd, name, dirRel, strings.Count(rel, "/"), st)
	if err != nil || d == nil {
		return changed, false, err
	}
	defer unix.Close(d.fd)
	left, err := h.w.leave(d, name)
	if err != nil {
		return changed, false, err
	}
	return changed || left, true, nil
}

// Finish gives the root back (the give-back) and closes it; what it
// reports covers the whole walk.
func (h *Hook) Finish() (GiveBackReport, error) {
	rep, err := h.finish()
	if err != nil {
		return rep, fmt.Errorf("give the worktree back: %w", err)
	}
	return rep, nil
}

func (h *Hook) finish() (GiveBackReport, error) {
	defer h.close()
	rep := &h.w.rep
	slices.Sort(rep.KeptPaths)
	if h.w.giveBack && h.w.changes(h.rootUID) {
		if err := unix.Fchown(h.fd, h.w.uid, h.w.gid); err != nil {
			return *rep, err
		}
		rep.Changed++
	}
	return *rep, nil
}

// close releases the root's descriptor, the root left as it is.
func (h *Hook) close() { unix.Close(h.fd) }
