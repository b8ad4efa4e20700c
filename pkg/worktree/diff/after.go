package diff

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/resolve"
)

// After is the worktree as the turn left it, built from before (a
// snapshot taken after Watch) and the watcher's events instead of a full
// walk: every entry an event names is read again, every directory that
// appeared, went or moved is walked or dropped whole, every entry with
// more than one link is read again; all else is before's. It stops the
// watcher. A nil snapshot comes with why it cannot vouch for the result
// (then take the full scan): a lost or unplaceable event, a truncated
// before, a mount below the worktree, a result past the scan's bounds.
//
// Why it equals a full scan taken now: an entry whose lstat changed since
// before was taken changed after Watch, through a path — its own (an
// event on its directory with its name), an ancestor's rename or removal
// (an event naming that directory, whose subtree is walked or dropped) —
// or, for a file with other links, through another link (before's linked,
// read again; a link made during the turn is a creation, an event). A
// change through a link outside the worktree to a file that had one link
// when before was taken reports a link-count event on the inode: its
// entries are read again. Events are resolved to paths now, after the
// turn: a directory moved during the turn is found where it is (its move
// was an event too). Reading an entry that did not change is harmless,
// so every doubt widens what is read, never narrows it.
func (w *Watcher) After(ctx context.Context, before *Snapshot) (*Snapshot, string) {
	if w == nil {
		return nil, "no watcher"
	}
	start := time.Now()
	w.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.doubt != "" {
		return nil, w.doubt
	}
	if before == nil || before.truncated {
		return nil, "the scan before the turn stopped at its bounds"
	}
	// Events are placed by their directory's path under w.root: were the
	// worktree (or a parent) moved since Watch, every one would seem
	// outside it and be dropped.
	if now, err := fdPath(w.rootFd); err != nil || now != w.root {
		return nil, fmt.Sprintf("the worktree moved (%s, %v)", now, err)
	}
	if m, err := mountBelow(w.root); err != nil || m != "" {
		return nil, fmt.Sprintf("a mount below the worktree (%s, %v)", m, err)
	}
	if before.ns != nil {
		return w.afterNamespace(ctx, before, start)
	}
	a := after{w: w, places: map[string]place{}, entries: map[string]bool{}, subtrees: map[string]bool{}}
	for dn, mask := range w.dirty {
		if why := a.file(dn, mask); why != "" {
			return nil, why
		}
	}
	for _, p := range before.linked {
		a.entries[p] = true
	}
	if len(w.inos) > 0 {
		for p, e := range before.entries {
			if e.mode&unix.S_IFMT != unix.S_IFDIR && w.inos[e.ino] {
				a.entries[p] = true
			}
		}
	}
	s := &Snapshot{entries: maps.Clone(before.entries)}
	// Entries that are, or were, directories of another identity take
	// their whole subtree with them.
	for p := range a.entries {
		b, was := before.entries[p]
		st, ok, why := a.lstat(p)
		if why != "" {
			return nil, why
		}
		if !ok {
			delete(s.entries, p)
			if was && isDir(b.mode) {
				a.subtrees[p] = true
			}
			continue
		}
		s.entries[p] = entryOf(&st)
		sameDir := was && isDir(b.mode) && isDir(st.Mode) && b.ino == st.Ino
		if !sameDir && (isDir(st.Mode) || (was && isDir(b.mode))) {
			a.subtrees[p] = true
		}
	}
	if why := a.walkSubtrees(ctx, before, s); why != "" {
		return nil, why
	}
	if len(s.entries) >= maxEntries || s.truncated {
		return nil, "the worktree is past the scan's bounds"
	}
	s.took = time.Since(start)
	return s, ""
}

// after is one After's work: the paths to read again.
type after struct {
	w        *Watcher
	places   map[string]place // directory handle → where it is now
	entries  map[string]bool  // worktree-relative paths to lstat again
	subtrees map[string]bool  // paths whose subtree is dropped and walked again
}

// place is where a directory handle lies now: rel in the worktree when in.
type place struct {
	rel string
	in  bool
}

// file files one event's (directory, name) under entries or subtrees.
func (a *after) file(dn dirName, mask uint64) string {
	pl, ok := a.places[dn.handle]
	if !ok {
		var why string
		if pl, why = a.w.place(dn.handle); why != "" {
			return why
		}
		a.places[dn.handle] = pl
	}
	if !pl.in {
		return ""
	}
	p := pl.rel
	if p != "" && p != ".git" && !strings.HasPrefix(p, ".git/") {
		a.entries[p] = true // its own mtime and ctime changed with its entries
	}
	if dn.name != "" && dn.name != "." {
		if strings.Contains(dn.name, "/") {
			return "an event name with a slash"
		}
		p = join(p, dn.name)
	}
	if p == "" || p == ".git" || strings.HasPrefix(p, ".git/") {
		return "" // the root, or the root's .git: scans leave them out
	}
	if mask&unix.FAN_ONDIR != 0 && mask&(unix.FAN_CREATE|unix.FAN_DELETE|unix.FAN_MOVED_FROM|unix.FAN_MOVED_TO) != 0 {
		a.subtrees[p] = true
	}
	a.entries[p] = true
	return ""
}

// place resolves a directory handle to where the directory is now,
// checked by opening that path beneath the worktree: a directory gone
// (removed, or its handle stale) is not in (its removal was an event in
// its parent); one found outside the worktree is not in; one that cannot
// be placed is a doubt.
func (w *Watcher) place(h string) (place, string) {
	fd, err := w.open(h)
	if errors.Is(err, unix.ESTALE) || errors.Is(err, unix.ENOENT) {
		return place{}, ""
	}
	if err != nil {
		return place{}, fmt.Sprintf("open a directory by handle: %v", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return place{}, fmt.Sprintf("stat a directory by handle: %v", err)
	}
	if st.Nlink == 0 {
		return place{}, "" // removed
	}
	p, err := fdPath(fd)
	if err != nil {
		return place{}, err.Error()
	}
	var rel string
	switch {
	case p == w.root:
	case strings.HasPrefix(p, strings.TrimSuffix(w.root, "/")+"/"):
		rel = p[len(strings.TrimSuffix(w.root, "/"))+1:]
	default:
		return place{}, "" // outside the worktree
	}
	dfd, err := w.beneath(rel, unix.O_PATH)
	if err == nil {
		var now unix.Stat_t
		err = unix.Fstat(dfd, &now)
		unix.Close(dfd)
		if err == nil && now.Dev == st.Dev && now.Ino == st.Ino {
			return place{rel: rel, in: true}, ""
		}
	}
	return place{}, fmt.Sprintf("a changed directory not found at %s", display(rel))
}

// beneath opens rel in the worktree as a full scan reaches it: no symbolic
// link, no other mount.
func (w *Watcher) beneath(rel string, flags uint64) (int, error) {
	if rel == "" {
		rel = "."
	}
	return unix.Openat2(w.rootFd, rel, &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: resolve.Beneath,
	})
}

// lstat reads rel as a full scan would (ok false: a full scan would not
// record it — gone, or below a link or a non-directory now).
func (a *after) lstat(rel string) (st unix.Stat_t, ok bool, why string) {
	dir, name := path.Split(rel)
	fd, err := a.w.beneath(strings.TrimSuffix(dir, "/"), unix.O_RDONLY|unix.O_DIRECTORY)
	if gone(err) {
		return st, false, ""
	}
	if err != nil {
		return st, false, fmt.Sprintf("open %s: %v", display(dir), err)
	}
	defer unix.Close(fd)
	err = unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return st, false, ""
	}
	if err != nil {
		return st, false, fmt.Sprintf("stat %s: %v", rel, err)
	}
	return st, true, ""
}

func gone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)
}

// walkSubtrees drops what s holds below every subtree (one pass over s,
// only when a directory that was one went) and walks each that is a
// directory now, outermost first.
func (a *after) walkSubtrees(ctx context.Context, before *Snapshot, s *Snapshot) string {
	if len(a.subtrees) == 0 {
		return ""
	}
	drop := false
	for p := range a.subtrees {
		if b, ok := before.entries[p]; ok && isDir(b.mode) {
			drop = true
		}
	}
	if drop {
		for p := range s.entries {
			if a.below(p) {
				delete(s.entries, p)
			}
		}
	}
	for p := range a.subtrees {
		if a.below(p) {
			continue // walked with its ancestor
		}
		fd, err := a.w.beneath(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK)
		if gone(err) {
			continue
		}
		if err != nil {
			return fmt.Sprintf("open %s: %v", p, err)
		}
		dir := os.NewFile(uintptr(fd), p)
		err = walker{}.walk(ctx, s, dir, p, strings.Count(p, "/")+1, nil)
		dir.Close()
		if err != nil {
			return err.Error()
		}
	}
	return ""
}

// below says whether a strict ancestor of p is a subtree.
func (a *after) below(p string) bool {
	for i := len(p) - 1; i > 0; i-- {
		if p[i] == '/' && a.subtrees[p[:i]] {
			return true
		}
	}
	return false
}

func isDir(mode uint32) bool { return mode&unix.S_IFMT == unix.S_IFDIR }

func entryOf(st *unix.Stat_t) entry {
	return entry{mode: st.Mode, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), ino: st.Ino}
}

// mountBelow is a mount point strictly below root in this mount namespace
// ("" none): a full scan walks into it, a filesystem mark does not see it.
func mountBelow(root string) (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	prefix := strings.TrimSuffix(root, "/") + "/"
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if strings.HasPrefix(mp, prefix) {
			return mp, nil
		}
	}
	return "", sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range []byte(s[i+1 : i+4]) {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + (c - '0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
