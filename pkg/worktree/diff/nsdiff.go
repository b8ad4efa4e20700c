package diff

import (
	"context"
	"time"

	"golang.org/x/sys/unix"
)

// region is what a snapshot after from the namespace read again: paths
// (lstat-ed) and subtrees (walked whole below them).
type region struct {
	paths    map[string]bool
	subtrees map[string]bool
}

// covers says whether the snapshot read p again (its entries are then
// the truth for p).
func (r *region) covers(p string) bool {
	if r.paths[p] || r.subtrees[p] {
		return true
	}
	for i := len(p) - 1; i > 0; i-- {
		if p[i] == '/' && r.subtrees[p[:i]] {
			return true
		}
	}
	return false
}

// ScanBefore is, for a snapshot before a turn, the report's scan_before
// and directory counts (Summary).
func (s *Snapshot) ScanBefore() (string, int, int) {
	ns := s.ns
	if ns == nil {
		if s.walkWhy != "" {
			return "walk: " + s.walkWhy, 0, 0
		}
		return "walk", 0, 0
	}
	how := "namespace"
	switch {
	case ns.clockStepped():
		how += ", the clock was set during the turn: every entry read again counts as changed"
	case ns.Cache != "":
		how += ", cache not used: " + ns.Cache
	}
	return how, ns.Dirs, ns.Relisted
}

// pair turns a snapshot before from the namespace and a snapshot after
// into two comparable snapshots: over the region the after snapshot read
// again (After), or over the whole worktree (a full walk after).
func pair(before, after *Snapshot) (*Snapshot, *Snapshot) {
	ns := before.ns
	if ns == nil {
		return before, after
	}
	if after.ns == ns && after.region != nil {
		return &Snapshot{entries: after.base, ns: ns, region: after.region, took: before.took}, after
	}
	trust := !ns.clockStepped()
	b := make(map[string]entry, len(after.entries))
	ns.each("", func(p string, n nsName) {
		a, ok := after.entries[p]
		b[p] = ns.beforeEntry(p, n, a, ok, trust)
	})
	return &Snapshot{entries: b, truncated: before.truncated, took: before.took}, after
}

// beforeEntry is the state at Ts of the path p the namespace names as n,
// given its state after (a, ok): a directory's is its recorded stat (only
// its mode and inode count); a non-directory with n's inode and type whose
// ctime is below Ts is unchanged (a); any other differs from a (ctime -1,
// which no entry has).
func (ns *Namespace) beforeEntry(p string, n nsName, a entry, ok, trust bool) entry {
	if n.typ == unix.DT_DIR {
		if d := ns.dirs[p]; d != nil {
			return entry{mode: d.mode, size: -1, mtime: d.mtime, ctime: d.ctime, ino: d.ino}
		}
	}
	if trust && ok && a.ino == n.ino && a.mode&unix.S_IFMT == typeOf(n.typ) && a.ctime < ns.ts {
		return a
	}
	return entry{mode: typeOf(n.typ), size: -1, ctime: -1, ino: n.ino}
}

// afterNamespace is After for a snapshot before from the namespace: the
// paths the events name are read again, then every path the namespace
// names with an inode among those read that may have other links (a write
// through one link shows at all; the links made between turns are in the
// namespace, hole 3 of the design), with an inode an event named without a
// path, or with one a change outside the worktree reached; directories that
// appeared, went or changed identity are walked whole. The state before of
// each is the namespace's (beforeEntry).
func (w *Watcher) afterNamespace(ctx context.Context, before *Snapshot, start time.Time) (*Snapshot, string) {
	ns := before.ns
	a := after{w: w, places: map[string]place{}, entries: map[string]bool{}, subtrees: map[string]bool{}}
	for dn, mask := range w.dirty {
		if why := a.file(dn, mask); why != "" {
			return nil, why
		}
	}
	if w.outsideLost {
		return nil, "too many files changed outside the worktree to place their links"
	}
	inos := map[uint64]bool{}
	for ino := range w.inos {
		inos[ino] = true
	}
	for h := range w.outside {
		if ino, nlink, ok := w.inodeLinks(h); ok && nlink > 1 {
			inos[ino] = true
		}
	}
	s := &Snapshot{entries: map[string]entry{}, ns: ns}
	read := func(p string) string {
		n, was := ns.lookup(p)
		st, ok, why := a.lstat(p)
		if why != "" {
			return why
		}
		wasDir := was && n.typ == unix.DT_DIR
		if was && !wasDir && (!ok || st.Ino != n.ino || st.Nlink > 1) {
			inos[n.ino] = true // its other links, if any, changed with it
		}
		if !ok {
			if wasDir {
				a.subtrees[p] = true
			}
			return ""
		}
		s.entries[p] = entryOf(&st)
		if !isDir(st.Mode) && st.Nlink > 1 {
			inos[st.Ino] = true
		}
		sameDir := wasDir && isDir(st.Mode) && n.ino == st.Ino
		if !sameDir && (isDir(st.Mode) || wasDir) {
			a.subtrees[p] = true
		}
		return ""
	}
	for p := range a.entries {
		if why := read(p); why != "" {
			return nil, why
		}
	}
	if len(inos) > 0 {
		for _, p := range ns.linked(inos) {
			if a.entries[p] {
				continue
			}
			a.entries[p] = true
			if why := read(p); why != "" {
				return nil, why
			}
		}
	}
	if why := a.walkSubtrees(ctx, &Snapshot{}, s); why != "" {
		return nil, why
	}
	if len(s.entries) >= maxEntries || s.truncated {
		return nil, "the worktree is past the scan's bounds"
	}
	s.region = &region{paths: a.entries, subtrees: a.subtrees}
	trust := !ns.clockStepped()
	s.base = map[string]entry{}
	add := func(p string, n nsName) {
		e, ok := s.entries[p]
		s.base[p] = ns.beforeEntry(p, n, e, ok, trust)
	}
	for p := range a.entries {
		if n, ok := ns.lookup(p); ok {
			add(p, n)
		}
	}
	for p := range a.subtrees {
		if n, ok := ns.lookup(p); ok && n.typ == unix.DT_DIR && !a.below(p) {
			ns.each(p, add)
		}
	}
	if err := before.Err(); err != nil {
		return nil, err.Error() // what was there before is unknown
	}
	s.took = time.Since(start)
	return s, ""
}

// inodeLinks is a handle's inode number and link count (ok false: gone).
func (w *Watcher) inodeLinks(h string) (uint64, uint64, bool) {
	fd, err := w.open(h)
	if err != nil {
		return 0, 0, false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || isDir(st.Mode) {
		return 0, 0, false
	}
	return st.Ino, st.Nlink, true
}

// inoSet is a set of inode numbers with a 1 024-bit filter in front of
// the map: the link pass asks it for every name of the namespace (100 000
// map lookups cost more than the pass's few matches).
type inoSet struct {
	filter [16]uint64
	inos   map[uint64]bool
}

func newInoSet(inos map[uint64]bool) *inoSet {
	s := &inoSet{inos: inos}
	for ino := range inos {
		h := inoHash(ino)
		s.filter[h>>6] |= 1 << (h & 63)
	}
	return s
}

func inoHash(ino uint64) uint64 { return (ino * 0x9e3779b97f4a7c15) >> 54 }

func (s *inoSet) has(ino uint64) bool {
	h := inoHash(ino)
	return s.filter[h>>6]&(1<<(h&63)) != 0 && s.inos[ino]
}

// linksOf appends to out the paths below rel of the non-directories whose
// inode is in inos, in the order each would give them; a path is built
// only for a match and for a directory to descend into (each builds one
// for every name: 100 000 allocations at 100 000 entries).
func (ns *Namespace) linksOf(rel string, inos *inoSet, out []string) []string {
	d := ns.dirs[rel]
	if d == nil {
		return out
	}
	d.each(func(n nsName) bool {
		switch {
		case n.typ == unix.DT_DIR:
			out = ns.linksOf(join(rel, n.name), inos, out)
		case inos.has(n.ino):
			out = append(out, join(rel, n.name))
		}
		return true
	})
	return out
}
