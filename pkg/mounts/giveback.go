package mounts

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/shrooms-cage/shrooms/pkg/resolve"
	"golang.org/x/sys/unix"
)

// maxGiveBackDepth bounds the directory nesting GiveBack descends (one open
// descriptor per level).
const maxGiveBackDepth = 4096

// GiveBackReport is what GiveBack did.
type GiveBackReport struct {
	Changed int `json:"changed"` // entries given back
	Skipped int `json:"skipped"` // entries that changed under the walk (left as they were)
	// Kept counts the nested git repositories left with the task's uid
	// (nested.go); KeptPaths lists them (worktree-relative, at most 100).
	Kept      int      `json:"kept,omitempty"`
	KeptPaths []string `json:"kept_paths,omitempty"`
}

// GiveBack gives every entry beneath dir (dir included) whose owner uid lies
// in [lo, hi) — the task's user namespace on the host — back to uid:gid,
// the worktree owner's. Entries owned by anyone else stay as they are. A git
// repository nested below dir stays with the task's uid (see nested.go).
//
// The walk is relative to descriptors: directories are opened with openat2
// and RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV|RESOLVE_NO_MAGICLINKS,
// so no symbolic link is followed and the walk never leaves dir or its
// filesystem; every other entry is changed with fchownat(AT_SYMLINK_NOFOLLOW)
// (lchown semantics: a link itself, never its target), so FIFOs, sockets and
// devices are never opened. An entry replaced while the walk runs is skipped,
// never followed. The kernel clears setuid/setgid bits of files it chowns.
func GiveBack(dir string, uid, gid int, lo, hi uint32) (GiveBackReport, error) {
	var rep GiveBackReport
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return rep, fmt.Errorf("give worktree %s back: %w", dir, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return rep, fmt.Errorf("give worktree %s back: %w", dir, err)
	}
	g := &giver{uid: uid, gid: gid, lo: lo, hi: hi, dev: st.Dev, rep: &rep}
	if err := g.dir(fd, "", 0); err != nil {
		return rep, fmt.Errorf("give worktree %s back: %w", dir, err)
	}
	slices.Sort(rep.KeptPaths)
	if st.Uid >= lo && st.Uid < hi {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return rep, fmt.Errorf("give worktree %s back: %w", dir, err)
		}
		rep.Changed++
	}
	return rep, nil
}

type giver struct {
	uid, gid int
	lo, hi   uint32
	dev      uint64
	rep      *GiveBackReport
}

// dir gives back the entries of the open directory fd (which it does not
// close), descending into subdirectories.
func (g *giver) dir(fd int, rel string, depth int) error {
	if depth > maxGiveBackDepth {
		return fmt.Errorf("directories nested deeper than %d levels", maxGiveBackDepth)
	}
	// A second descriptor for reading entries, so fd stays usable for *at calls.
	rfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(rfd), ".")
	defer f.Close()
	for {
		names, err := f.Readdirnames(1024)
		for _, name := range names {
			if err := g.entry(fd, name, rel, depth); err != nil {
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

func (g *giver) entry(fd int, name, rel string, depth int) error {
	var st unix.Stat_t
	if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			g.rep.Skipped++
			return nil
		}
		return fmt.Errorf("stat %s: %w", name, err)
	}
	if st.Dev != g.dev {
		return nil // a mount point inside: not ours to change
	}
	if isNestedGit(name, depth) {
		return g.keep(fd, name, joinRel(rel, name), &st)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		child, err := unix.Openat2(fd, name, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK,
			Resolve: resolve.Beneath,
		})
		switch {
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EXDEV):
			g.rep.Skipped++ // replaced under the walk: never followed
			return nil
		case err != nil:
			return fmt.Errorf("open %s: %w", name, err)
		}
		defer unix.Close(child)
		var cst unix.Stat_t
		if err := unix.Fstat(child, &cst); err != nil {
			return fmt.Errorf("stat %s: %w", name, err)
		}
		if cst.Dev != st.Dev || cst.Ino != st.Ino {
			g.rep.Skipped++
			return nil
		}
		if looksLikeGitDir(child) && !(depth == 0 && name == ".git") {
			return g.keep(fd, name, joinRel(rel, name), &cst)
		}
		if err := g.dir(child, joinRel(rel, name), depth+1); err != nil {
			return fmt.Errorf("%s/%w", name, err)
		}
		if cst.Uid >= g.lo && cst.Uid < g.hi {
			if err := unix.Fchown(child, g.uid, g.gid); err != nil {
				return fmt.Errorf("chown %s: %w", name, err)
			}
			g.rep.Changed++
		}
		return nil
	}
	if st.Uid < g.lo || st.Uid >= g.hi {
		return nil
	}
	if err := unix.Fchownat(fd, name, g.uid, g.gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			g.rep.Skipped++
			return nil
		}
		return fmt.Errorf("chown %s: %w", name, err)
	}
	g.rep.Changed++
	return nil
}

// GiveBackHook is GiveBack one entry at a time, for the walk that also
// takes the worktree's change snapshot after a turn (diff.ScanThenHook):
// the same decisions per entry, the root given back by Finish. A walk that
// stopped short of the whole tree (its bounds) must be followed by GiveBack.
type GiveBackHook struct {
	fd      int
	rootUID uint32
	g       *giver
}

// NewGiveBackHook opens the worktree dir for a give-back to uid:gid of
// what the task's uids [lo, hi) own.
func NewGiveBackHook(dir string, uid, gid int, lo, hi uint32) (*GiveBackHook, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("give worktree %s back: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("give worktree %s back: %w", dir, err)
	}
	return &GiveBackHook{fd: fd, rootUID: st.Uid, g: &giver{uid: uid, gid: gid, lo: lo, hi: hi, dev: st.Dev, rep: &GiveBackReport{}}}, nil
}

// Entry gives back the entry name of the directory dirFd (rel below the
// worktree root, never the root's own .git), which st describes. It
// reports whether it changed the entry and whether what lies below it is
// to be given back too (a directory of the worktree's filesystem that is
// no git repository).
func (h *GiveBackHook) Entry(dirFd int, name, rel string, st *unix.Stat_t) (changed, below bool, err error) {
	g := h.g
	if st.Dev != g.dev {
		return false, false, nil // a mount point inside: not ours to change
	}
	if name == ".git" {
		return false, false, g.keep(dirFd, name, rel, st)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if st.Uid < g.lo || st.Uid >= g.hi {
			return false, false, nil
		}
		err := unix.Fchownat(dirFd, name, g.uid, g.gid, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			g.rep.Skipped++
			return false, false, nil
		}
		if err != nil {
			return false, false, fmt.Errorf("chown %s: %w", name, err)
		}
		g.rep.Changed++
		return true, false, nil
	}
	child, err := unix.Openat2(dirFd, name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: resolve.Beneath,
	})
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EXDEV):
		g.rep.Skipped++ // replaced under the walk: never followed
		return false, false, nil
	case err != nil:
		return false, false, fmt.Errorf("open %s: %w", name, err)
	}
	defer unix.Close(child)
	var cst unix.Stat_t
	if err := unix.Fstat(child, &cst); err != nil {
		return false, false, fmt.Errorf("stat %s: %w", name, err)
	}
	if cst.Dev != st.Dev || cst.Ino != st.Ino {
		g.rep.Skipped++
		return false, false, nil
	}
	if looksLikeGitDir(child) {
		return false, false, g.keep(dirFd, name, rel, &cst)
	}
	if cst.Uid >= g.lo && cst.Uid < g.hi {
		if err := unix.Fchown(child, g.uid, g.gid); err != nil {
			return false, false, fmt.Errorf("chown %s: %w", name, err)
		}
		g.rep.Changed++
		return true, true, nil
	}
	return false, true, nil
}

// Finish gives the root back and closes it; what it reports covers the
// whole walk.
func (h *GiveBackHook) Finish() (GiveBackReport, error) {
	defer unix.Close(h.fd)
	rep := h.g.rep
	slices.Sort(rep.KeptPaths)
	if h.rootUID >= h.g.lo && h.rootUID < h.g.hi {
		if err := unix.Fchown(h.fd, h.g.uid, h.g.gid); err != nil {
			return *rep, fmt.Errorf("give the worktree back: %w", err)
		}
		rep.Changed++
	}
	return *rep, nil
}
