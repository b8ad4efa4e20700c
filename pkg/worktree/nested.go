package worktree

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/shrooms-cage/shrooms/pkg/resolve"
	"golang.org/x/sys/unix"
)

// Nested repositories stay the cage's. Git reads a repository's config and
// hooks and runs what they name (core.fsmonitor, core.pager,
// core.sshCommand, aliases, hooks) for whoever runs git in it; its only
// defence against a repository someone else wrote is its ownership check
// ("detected dubious ownership"). So a git directory below the worktree
// root — an entry named .git (directory, gitdir pointer file or link), or a
// directory laid out as one (HEAD with objects and refs, or with commondir:
// a bare repository, or the target a pointer names) — is never handed to the
// worktree's owner: the give-back leaves it with the task's uid and takes
// away its access for others, so the owner's git refuses it (and, unless the
// owner is root, cannot read it at all, even with safe.directory=*). The
// owner's own nested repositories are never handed to the task either
// (the hand-over), so a turn cannot change one in place: a repository the
// task's uid owns after a turn is one the turn made or replaced. The
// worktree root's own .git keeps its treatment (read-only in the cage).

// maxKeptListed bounds the paths a GiveBackReport lists.
const maxKeptListed = 100

// looksLikeGitDir reports whether the open directory fd is laid out as a
// git directory (git's own is_git_directory test, loosely: HEAD with
// objects and refs, or HEAD with a commondir pointer), looking at names
// only, following nothing.
func looksLikeGitDir(fd int) bool {
	has := func(name string) bool {
		var st unix.Stat_t
		return unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	}
	return has("HEAD") && ((has("objects") && has("refs")) || has("commondir"))
}

// keep leaves the nested repository entry name of directory fd with whoever
// owns it; one the task's uid range owns loses its permissions for others
// (its owner and group, the task's, keep theirs for the next turn). A link
// is left as it is (lchown semantics: nothing followed).
func (w *walker) keep(fd int, name, rel string, st *unix.Stat_t) error {
	inRange := st.Uid >= w.lo && st.Uid < w.hi
	if inRange {
		w.rep.Kept++
		if len(w.rep.KeptPaths) < maxKeptListed {
			w.rep.KeptPaths = append(w.rep.KeptPaths, rel)
		}
	}
	if !inRange || st.Mode&0o007 == 0 {
		return nil
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR, unix.S_IFREG:
	default:
		return nil
	}
	efd, err := unix.Openat2(fd, name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY,
		Resolve: resolve.Beneath,
	})
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		w.rep.Skipped++
		return nil
	case err != nil:
		return fmt.Errorf("open %s: %w", name, err)
	}
	defer unix.Close(efd)
	var now unix.Stat_t
	if err := unix.Fstat(efd, &now); err != nil {
		return fmt.Errorf("stat %s: %w", name, err)
	}
	if now.Dev != st.Dev || now.Ino != st.Ino {
		w.rep.Skipped++ // replaced under the walk
		return nil
	}
	if err := unix.Fchmod(efd, now.Mode&0o7770); err != nil {
		return fmt.Errorf("chmod %s: %w", name, err)
	}
	return nil
}

func joinRel(rel, name string) string {
	if rel == "" {
		return name
	}
	return filepath.Join(rel, name)
}
