package diff

import "slices"

// Changed lists the worktree-relative paths of the entries after has that
// before had not, or had otherwise (what Diff counts as added or
// modified, directories whose entries alone changed left out), sorted: what
// a give-back that looks only at the turn's changes visits.
func Changed(before, after *Snapshot) []string {
	before, after = pair(before, after)
	var paths []string
	for rel, a := range after.entries {
		b, ok := before.entries[rel]
		if ok && (b == a || (b.mode == a.mode && b.ino == a.ino && isDir(a.mode))) {
			continue
		}
		paths = append(paths, rel)
	}
	slices.Sort(paths)
	return paths
}
