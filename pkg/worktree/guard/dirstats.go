package guard

import "golang.org/x/sys/unix"

// DirStats is the stat of every directory one guard scan took (before that
// directory's listing or cache lookup), by worktree-relative path ("" the
// root), for the change scan before the same turn (diff.ScanNamespace), so
// that the worktree's directories are stat-ed once per turn, not twice. It
// lives in memory for one turn and is taken once (Take): never kept on disk,
// never handed to another turn.
type DirStats struct {
	dirs map[string]unix.Stat_t
}

// Take returns the stats and empties the table (nil: none, or already
// taken).
func (t *DirStats) Take() map[string]unix.Stat_t {
	if t == nil {
		return nil
	}
	m := t.dirs
	t.dirs = nil
	return m
}

// Len is the number of directories in the table.
func (t *DirStats) Len() int {
	if t == nil {
		return 0
	}
	return len(t.dirs)
}
