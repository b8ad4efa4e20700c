// Package diff summarises what a turn changed in its worktree: a scan
// before the cage starts and one after it is gone, compared entry by entry.
// The walk is fd-relative and never follows a link or opens anything but a
// directory (entries are looked at with fstatat(AT_SYMLINK_NOFOLLOW)), so a
// hostile tree cannot steer it.
//
// An entry counts as modified when its type, size, modification time,
// status-change time (ctime), permission bits or inode differ. Ownership is
// left out: shrooms itself hands the worktree to the task's user and back
// around every turn, and the two scans record the tree as the turn found
// and left it (the hand-over's walk after its chowns, ScanHook; the
// give-back's before its own, ScanThenHook), so those chowns never show in
// ctime either. ctime is what catches a file rewritten in place with its
// size and mtime restored: no process but the kernel sets it. It is still a
// report for the owner and the orchestrator, not a boundary (the guard and
// the sealed commit path read content).
package diff

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/worktree/guard"
)

// Bounds of one scan; past them the summary says truncated.
const (
	maxEntries = 4_000_000
	maxDepth   = 128
	// maxListed bounds the agent-config roots listed in a summary.
	maxListed = 100
)

type entry struct {
	mode  uint32 // type and permission bits
	size  int64
	mtime int64 // ns
	ctime int64 // ns: set by the kernel only, a rewrite cannot restore it
	ino   uint64
}

// Snapshot is a worktree's entries by worktree-relative path (the root's
// .git excluded: it is read-only in the cage).
type Snapshot struct {
	entries   map[string]entry
	truncated bool
	// linked are the non-directories with more than one link: a change
	// through one link shows at every other (Watcher.After re-reads them).
	linked []string
	took   time.Duration
	// ns: a snapshot before taken from the worktree's namespace
	// (ScanNamespace), with no entries of its own.
	ns *Namespace
	// region and base: a snapshot after from the namespace and the turn's
	// events (After) holds only the entries of region (the paths read
	// again, the subtrees walked again); base is the state before of the
	// same paths, from the namespace and the ctime rule. Elsewhere the
	// worktree is as the namespace names it, before and after.
	region *region
	base   map[string]entry
	// walkWhy: why a snapshot before is a full walk ("" unsaid).
	walkWhy string
	// clock: a snapshot before's clock-step timer (Settle).
	clock *stepTimer
}

// SetWalkWhy records why the snapshot before a turn was a full walk (the
// report's scan_before).
func (s *Snapshot) SetWalkWhy(why string) { s.walkWhy = why }

// has says whether the snapshot holds an entry at rel.
func (s *Snapshot) has(rel string) bool {
	if _, ok := s.entries[rel]; ok {
		return true
	}
	if s.ns == nil || s.region == nil || s.region.covers(rel) {
		return false
	}
	_, ok := s.ns.lookup(rel)
	return ok
}

// Scan takes a snapshot of the worktree at root.
func Scan(ctx context.Context, root string) (*Snapshot, error) {
	return ScanHook(ctx, root, nil)
}

// Hook changes entries while a scan passes, so that one walk does both:
// worktree.Hook's hand-over (the chown to the task's user before a turn)
// and give-back (the chown back after it). Entry gets each entry's
// directory descriptor, name, worktree-relative path and lstat (never the
// root's own .git, which scans leave out); it says whether it changed the
// entry and whether it is to see what lies below it.
type Hook interface {
	Entry(dirFd int, name, rel string, st *unix.Stat_t) (changed, below bool, err error)
}

// ScanHook is Scan with hook called on every entry it records (below a
// directory the hook declined, no more), recording each entry as the hook
// left it: the snapshot before a turn, taken by the hand-over's walk.
func ScanHook(ctx context.Context, root string, hook Hook) (*Snapshot, error) {
	return scanHook(ctx, root, hook, true)
}

// ScanThenHook is ScanHook recording each entry as it was before the hook
// changed it: the snapshot after a turn, taken by the give-back's walk.
// A truncated snapshot (Truncated) means the hook did not see everything.
func ScanThenHook(ctx context.Context, root string, hook Hook) (*Snapshot, error) {
	return scanHook(ctx, root, hook, false)
}

func scanHook(ctx context.Context, root string, hook Hook, after bool) (*Snapshot, error) {
	start := time.Now()
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("worktree changes: open %s: %w", root, err)
	}
	dir := os.NewFile(uintptr(fd), root)
	defer dir.Close()
	s := &Snapshot{entries: map[string]entry{}}
	w := walker{after: after}
	if hook != nil {
		w.links = map[[2]uint64][]string{}
	}
	if err := w.walk(ctx, s, dir, "", 0, hook); err != nil {
		return nil, err
	}
	s.took = time.Since(start)
	return s, nil
}

// walker is a scan's walk: with a hook, after says whether entries are
// recorded as the hook left them. links are the paths recorded so far of
// each inode with more than one link: the hook's change through one link
// (a chown sets the inode's ctime) shows at all of them.
type walker struct {
	after bool
	links map[[2]uint64][]string // by device and inode
}

func (w walker) walk(ctx context.Context, s *Snapshot, dir *os.File, rel string, depth int, hook Hook) error {
	if depth > maxDepth {
		s.truncated = true
		return nil
	}
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("worktree changes: read %s: %w", display(rel), err)
	}
	for _, name := range names {
		if rel == "" && name == ".git" {
			continue
		}
		if len(s.entries) >= maxEntries {
			s.truncated = true
			return nil
		}
		if len(s.entries)%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		var st unix.Stat_t
		if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // gone since the directory was read
			}
			return fmt.Errorf("worktree changes: stat %s: %w", join(rel, name), err)
		}
		child := join(rel, name)
		below := hook
		if hook != nil {
			found := st
			changed, down, err := hook.Entry(int(dir.Fd()), name, child, &found)
			if err != nil {
				return fmt.Errorf("%s: %w", child, err)
			}
			if !down {
				below = nil
			}
			if changed && w.after {
				if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					if errors.Is(err, unix.ENOENT) {
						continue
					}
					return fmt.Errorf("worktree changes: stat %s: %w", child, err)
				}
			}
		}
		e := entry{mode: st.Mode, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), ino: st.Ino}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if st.Nlink > 1 {
				s.linked = append(s.linked, child)
				e = w.link(s, child, e, st.Dev)
			}
			s.entries[child] = e
			continue
		}
		s.entries[child] = e
		fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			continue // replaced since the stat: not a directory to walk now
		}
		if err != nil {
			return fmt.Errorf("worktree changes: open %s: %w", child, err)
		}
		sub := os.NewFile(uintptr(fd), child)
		if below != nil {
			// The hook vetted the directory it saw; one replaced since
			// is walked, not changed.
			var now unix.Stat_t
			if unix.Fstat(fd, &now) != nil || now.Dev != st.Dev || now.Ino != st.Ino {
				below = nil
			}
		}
		err = w.walk(ctx, s, sub, child, depth+1, below)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// link records rel, one of an inode's links, and returns its entry as the
// snapshot keeps it. With a hook, every link of an inode is to read the
// same: as the first link was found before the hook's changes (a snapshot
// after a turn), or as the last one was left by them (before a turn, where
// the earlier links are brought up to date).
func (w walker) link(s *Snapshot, rel string, e entry, dev uint64) entry {
	if w.links == nil {
		return e
	}
	id := [2]uint64{dev, e.ino}
	prev := w.links[id]
	w.links[id] = append(prev, rel)
	if len(prev) == 0 {
		return e
	}
	if !w.after {
		return s.entries[prev[0]]
	}
	for _, p := range prev {
		s.entries[p] = e
	}
	return e
}

// Entries is how many entries the snapshot holds.
func (s *Snapshot) Entries() int { return len(s.entries) }

// Truncated reports whether the scan stopped at its bounds (a hook then
// did not see the whole tree either).
func (s *Snapshot) Truncated() bool { return s.truncated }

// Change is one guarded root (agent or tool config) the turn touched.
type Change struct {
	Path string `json:"path"`
	// Change is "added", "modified" or "deleted" (the root itself, or
	// anything beneath it).
	Change string `json:"change"`
	// Why is what loads it (guard.Why).
	Why string `json:"why,omitempty"`
}

// Summary is what a turn changed in its worktree.
type Summary struct {
	Added    int `json:"added"`
	Modified int `json:"modified"`
	Deleted  int `json:"deleted"`
	// AgentConfig lists the guarded roots among the changes (at most
	// maxListed; AgentConfigCount counts them all).
	AgentConfig      []Change `json:"agent_config"`
	AgentConfigCount int      `json:"agent_config_count"`
	// Truncated: a scan stopped at its bounds, so counts are lower bounds.
	Truncated bool    `json:"truncated,omitempty"`
	ScanMS    float64 `json:"scan_ms"`
	// ScanAfter is how the worktree after the turn was read: "events"
	// (the turn's fanotify events, Watcher.After) or "walk: why".
	ScanAfter string `json:"scan_after,omitempty"`
	// ScanBefore is how the worktree before the turn was read:
	// "namespace" (its directories' listings revalidated, ScanNamespace;
	// with why after a comma when the cache was not used or the clock was
	// set during the turn) or "walk" (a full walk; ": why" when one was
	// tried instead).
	ScanBefore string `json:"scan_before,omitempty"`
	// DirsRevalidated and DirsRelisted count, for a "namespace" scan
	// before, the worktree's directories and those listed again.
	DirsRevalidated int `json:"dirs_revalidated,omitempty"`
	DirsRelisted    int `json:"dirs_relisted,omitempty"`
	// DirsStatted and DirsStatShared split the directories below the root
	// of a "namespace" scan before: stat-ed by it, or by the turn's guard
	// scan just before (Snapshot.DirsStatted).
	DirsStatted    int `json:"dirs_statted,omitempty"`
	DirsStatShared int `json:"dirs_stat_shared,omitempty"`
}

// Diff compares the worktree before a turn with the one after it.
// Directories count when added or deleted, not when only their entries
// changed.
func Diff(before, after *Snapshot) Summary { return DiffRefs(before, after, nil) }

// DiffRefs is Diff that also lists, as agent config, the changed paths
// referenced says are loaded or run by trusted config (guard's
// Check.Referenced: a CLAUDE.md import, an opencode instructions file, a
// script a trusted .envrc or hook runs), with referenced's why.
func DiffRefs(before, after *Snapshot, referenced func(rel string) string) Summary {
	sum := Summary{AgentConfig: []Change{}, Truncated: before.truncated || after.truncated,
		ScanMS: float64(before.took+after.took) / float64(time.Millisecond)}
	before, after = pair(before, after)
	roots := map[string]string{}
	whys := map[string]string{}
	touch := func(rel, change string) {
		root := guard.GuardedRoot(rel)
		if root == "" {
			root = nestedRepoRoot(rel, before, after)
		}
		if root == "" {
			if referenced == nil {
				return
			}
			if why := referenced(rel); why != "" {
				roots[rel], whys[rel] = change, why
			}
			return
		}
		if root != rel {
			change = "modified" // something beneath the root
			if !before.has(root) {
				change = "added"
			} else if !after.has(root) {
				change = "deleted"
			}
		}
		roots[root] = change
	}
	for rel, a := range after.entries {
		b, ok := before.entries[rel]
		switch {
		case !ok:
			sum.Added++
			touch(rel, "added")
		case b.mode&unix.S_IFMT == unix.S_IFDIR && a.mode&unix.S_IFMT == unix.S_IFDIR && b.mode == a.mode && b.ino == a.ino:
			// A directory whose entries changed: counted by its entries.
		case b != a:
			sum.Modified++
			touch(rel, "modified")
		}
	}
	for rel := range before.entries {
		if _, ok := after.entries[rel]; !ok {
			sum.Deleted++
			touch(rel, "deleted")
		}
	}
	paths := make([]string, 0, len(roots))
	for p := range roots {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	sum.AgentConfigCount = len(paths)
	for _, p := range paths[:min(len(paths), maxListed)] {
		w, ok := whys[p]
		if !ok {
			w = why(p, before, after)
		}
		sum.AgentConfig = append(sum.AgentConfig, Change{Path: p, Change: roots[p], Why: w})
	}
	return sum
}

// why says why a listed root is agent config.
func why(p string, before, after *Snapshot) string {
	if w := guard.Why(p); w != "" || nestedRepoRoot(p, before, after) != p {
		return w
	}
	return nestedWhy
}

func join(rel, name string) string {
	if rel == "" {
		return name
	}
	return rel + "/" + name
}

func display(rel string) string {
	if rel == "" {
		return "."
	}
	return strings.TrimPrefix(rel, "/")
}
