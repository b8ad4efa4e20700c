package diff

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/resolve"
	"github.com/shrooms-cage/shrooms/pkg/worktree/guard"
)

// The scan before a turn from the worktree's namespace, without a stat of
// every file (docs/performance.md, "The scan before the turn, from the
// namespace"). A Namespace is, per directory of the worktree, its inode,
// mode, times and listing (name, inode and type of each entry, from
// getdents: no stat per file), kept between turns in the task's trust
// store. Before a turn every cached directory is stat-ed again and only
// those whose (inode, mtime, ctime) moved are listed again: a listing
// changes only with an entry added, removed or renamed in the directory,
// which sets its ctime (the kernel's clock). The result names, for every
// path of the worktree at the turn's start, its inode and type.
//
// What the turn changed is then settled per path the turn's events name
// (After) by the ctime rule: an entry with the inode the namespace names
// for its path whose ctime is below Ts (the turn's start, after the
// revalidation) is as it was at Ts — size, mode, owner, times, link count
// and a rename of the inode itself all set ctime —, so its state before is
// its state after; any other is added, deleted or modified exactly as a
// full walk at Ts would have it. The namespace's identity of the path is
// what makes the rule hold for a directory the turn renamed, whose
// subtree keeps its old ctimes (those paths are not in the namespace:
// added).

// Namespace is the worktree's directories and their listings at the
// turn's start (the before snapshot of a turn scanned by ScanNamespace).
type Namespace struct {
	root             string
	rootDev, rootIno uint64
	dirs             map[string]*nsDir
	cachePath        string
	// linkPass: how the last link pass searched ("full", "filtered":
	// only the directories listed again; "" none), for the tests.
	linkPass string
	// src is the cache file the listings of the directories unchanged
	// since it was written are read from (nil: none was used).
	src *nsSource
	// changed: a directory was listed again or dropped (Keep writes).
	changed bool
	// precise is CLOCK_REALTIME once the revalidation was done, ts the
	// turn's start for the ctime rule (Settle: precise), and once Ready
	// saw the coarse clock past it every ctime set later is ≥ ts.
	precise, ts int64
	clock       *stepTimer // armed at Settle
	ready       bool       // Ready saw the coarse clock at ts
	Relisted    int        // directories listed again
	Dirs        int        // directories in the namespace
	Statted     int        // directories below the root stat-ed here
	Shared      int        // directories whose stat came from the guard's scan (DirStats)
	// Cache says why the cache file was not used ("" when it was).
	Cache string
}

// nsDir is one directory: its stat (taken before its listing) and the
// listing, sorted by name: names, or until first needed raw, the listing
// as the cache file holds it (count names), itself read from the file
// only when first needed (lazy), so that revalidating a 100 000-entry
// worktree reads nothing per file.
type nsDir struct {
	ino          uint64
	mode         uint32
	mtime, ctime int64
	listed       int64 // coarse clock before the stat that preceded the listing
	names        []nsName
	raw          string
	count        int
	lazy         *nsLazy // the listing, still in the cache file
	cached       bool    // the listing is the cache file's (its inode filter covers it)
	// What the revalidation and Nested need of the listing, taken in the
	// one pass that checks it (decodeNamespace) or lists it (list), so
	// that neither walks the 100 000 names of an unchanged worktree again:
	// its subdirectories (DT_DIR entries, .git ones included), an entry
	// of unknown type, the inode of an entry named .git, and whether it
	// is laid out as a git directory (gitDir).
	subs    []nsName
	unknown bool
	dotGit  bool
	gitIno  uint64
	layout  bool
}

// indexer takes the nsDir's index from its entries, given in order.
type indexer struct {
	d                                      *nsDir
	head, objects, refs, commondir, dotGit bool
}

func (x *indexer) add(n nsName) {
	d := x.d
	switch n.name {
	case ".git":
		d.dotGit, d.gitIno = true, n.ino
	case "HEAD":
		x.head = true
	case "objects":
		x.objects = true
	case "refs":
		x.refs = true
	case "commondir":
		x.commondir = true
	}
	switch n.typ {
	case unix.DT_DIR:
		d.subs = append(d.subs, n)
	case unix.DT_UNKNOWN:
		d.unknown = true
	}
}

func (x *indexer) done() {
	x.d.layout = x.head && ((x.objects && x.refs) || x.commondir)
}

// indexedName says whether the index (indexer.add) looks at an entry of
// this name whatever its type.
func indexedName(name string) bool {
	switch len(name) {
	case 4:
		return name == ".git" || name == "HEAD" || name == "refs"
	case 7:
		return name == "objects"
	case 9:
		return name == "commondir"
	}
	return false
}

// index takes the nsDir's index from its decoded names.
func (d *nsDir) index() {
	x := indexer{d: d}
	for _, n := range d.names {
		x.add(n)
	}
	x.done()
}

// list is the directory's listing, decoded from raw once (empty when the
// cache file failed: Snapshot.Err).
func (d *nsDir) list() []nsName {
	if !d.load() {
		return nil
	}
	if d.names == nil && d.count > 0 {
		d.names = make([]nsName, 0, d.count)
		eachRaw(d.raw, func(n nsName) bool { d.names = append(d.names, n); return true })
	}
	return d.names
}

// each calls fn with each entry of the listing in order, until fn says
// stop, without decoding raw into names.
func (d *nsDir) each(fn func(nsName) bool) {
	if !d.load() {
		return
	}
	if d.names != nil || d.count == 0 {
		for _, n := range d.names {
			if !fn(n) {
				return
			}
		}
		return
	}
	eachRaw(d.raw, fn)
}

func (d *nsDir) len() int {
	if d.names != nil {
		return len(d.names)
	}
	return d.count
}

type nsName struct {
	name string
	ino  uint64
	typ  uint8 // DT_*
}

// racyWindow: a directory whose mtime or ctime is within it of its
// listing's time is listed again next time (a later change in the same
// clock tick could leave the same times: git's racy rule).
const racyWindow = int64(time.Second)

// ScanNamespace is the snapshot before a turn from the worktree's
// namespace, revalidated against the cache file cachePath ("" none; a
// file missing, foreign or corrupt is ignored and every directory is
// listed). A nil snapshot comes with why the full walk must be taken:
// a filesystem whose times may not be this kernel's (outside ext4, xfs,
// btrfs, tmpfs) or that gives no entry types, a mount below the worktree,
// a directory that changed while read, a ctime ahead of the clock, a
// worktree past the scan's bounds.
//
// shared (nil: none) is the guard's directory stats from the same turn
// (guard.DirStats, taken here): a directory it has is not stat-ed again,
// every check below runs on the guard's stat as on one taken here. That
// is exact: the guard's stat was taken earlier under the same task lock
// with nothing of the cage running, so it only widens, by those
// milliseconds, the window that already lies between this stat and the
// watch's start (Watch). A host change to a directory in it is not in
// the namespace: the report from the turn's events does not count it (a
// walk after does, as for a change right after this stat), and it left a
// ctime the record does not have, so the next turn lists the directory
// again. The caller passes no table when anything of its own changed the
// worktree after the guard's scan.
func ScanNamespace(ctx context.Context, root, cachePath string, shared *guard.DirStats) (*Snapshot, string) {
	start := time.Now()
	ns, why := revalidate(ctx, root, cachePath, shared.Take())
	if ns == nil {
		return nil, why
	}
	return &Snapshot{ns: ns, took: time.Since(start)}, ""
}

func revalidate(ctx context.Context, root, cachePath string, shared map[string]unix.Stat_t) (*Namespace, string) {
	rootFd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Sprintf("open %s: %v", root, err)
	}
	defer unix.Close(rootFd)
	var sfs unix.Statfs_t
	var rst unix.Stat_t
	if err := unix.Fstatfs(rootFd, &sfs); err != nil {
		return nil, fmt.Sprintf("statfs: %v", err)
	}
	if !guard.LocalTimeFS(int64(sfs.Type)) {
		return nil, fmt.Sprintf("a filesystem (0x%x) outside ext4, xfs, btrfs and tmpfs", sfs.Type)
	}
	if err := unix.Fstat(rootFd, &rst); err != nil {
		return nil, fmt.Sprintf("stat: %v", err)
	}
	if r, ok := shared[""]; !ok || r.Dev != rst.Dev || r.Ino != rst.Ino {
		shared = nil // another directory's stats (or none)
	}
	ns := &Namespace{root: root, rootDev: rst.Dev, rootIno: rst.Ino, dirs: map[string]*nsDir{}, cachePath: cachePath}
	var old map[string]*nsDir
	switch {
	case cachePath == "":
		ns.Cache = "no cache file"
	default:
		var why string
		if old, ns.src, why = readNamespace(cachePath, root, rst.Dev, rst.Ino); old == nil {
			ns.Cache = why
		}
	}
	done := false
	defer func() {
		if !done {
			ns.src.close()
		}
	}()
	ns.changed = len(old) == 0
	if len(old) > 0 {
		ns.dirs = make(map[string]*nsDir, len(old)) // no growth over every directory
	}
	now, err := coarse()
	if err != nil {
		return nil, err.Error()
	}
	type item struct {
		rel   string
		ino   uint64
		depth int
	}
	stack := []item{{rel: "", ino: rst.Ino}}
	entries := 0
	for len(stack) > 0 {
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if it.depth > maxDepth {
			return nil, "directories nested past the scan's bounds"
		}
		if len(ns.dirs)%256 == 0 && ctx.Err() != nil {
			return nil, ctx.Err().Error()
		}
		var st unix.Stat_t
		var ok bool
		if it.rel == "" {
			st = rst
		} else if st, ok = shared[it.rel]; ok {
			ns.Shared++
		} else {
			if err := unix.Fstatat(rootFd, it.rel, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return nil, fmt.Sprintf("stat %s: %v", it.rel, err)
			}
			ns.Statted++
		}
		if why := ns.sameDir(it.rel, &st, it.ino); why != "" {
			return nil, why
		}
		if st.Ctim.Nano() > now+racyWindow {
			return nil, fmt.Sprintf("%s: a ctime ahead of the clock", display(it.rel))
		}
		d := old[it.rel]
		if d == nil || d.ino != st.Ino || d.mtime != st.Mtim.Nano() || d.ctime != st.Ctim.Nano() || d.mode != st.Mode ||
			d.ctime >= d.listed-racyWindow || d.mtime >= d.listed-racyWindow {
			var why string
			if d, why = ns.list(rootFd, it.rel, it.ino); why != "" {
				return nil, why
			}
			ns.Relisted++
			ns.changed = true
		}
		ns.dirs[it.rel] = d
		entries += d.len()
		if entries >= maxEntries {
			return nil, "the worktree is past the scan's bounds"
		}
		if d.unknown {
			return nil, "the filesystem gives no entry types"
		}
		for _, n := range d.subs {
			stack = append(stack, item{rel: join(it.rel, n.name), ino: n.ino, depth: it.depth + 1})
		}
	}
	if len(ns.dirs) != len(old) {
		ns.changed = true // directories gone
	}
	ns.Dirs = len(ns.dirs)
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return nil, fmt.Sprintf("clock: %v", err)
	}
	ns.precise = ts.Nano()
	done = true
	return ns, ""
}

// sameDir checks that the directory rel, stat-ed as st, is the one its
// parent's listing names (ino), on the worktree's filesystem.
func (ns *Namespace) sameDir(rel string, st *unix.Stat_t, ino uint64) string {
	switch {
	case st.Dev != ns.rootDev:
		return fmt.Sprintf("a mount below the worktree at %s", display(rel))
	case st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Ino != ino:
		return fmt.Sprintf("%s changed while the worktree was read", display(rel))
	}
	return ""
}

// list reads the directory rel: its stat first, then its listing (a change
// during the read leaves a ctime the record does not have).
func (ns *Namespace) list(rootFd int, rel string, ino uint64) (*nsDir, string) {
	p := rel
	if p == "" {
		p = "."
	}
	fd, err := unix.Openat2(rootFd, p, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: resolve.Beneath,
	})
	if err != nil {
		return nil, fmt.Sprintf("open %s: %v", display(rel), err)
	}
	defer unix.Close(fd)
	listed, err := coarse()
	if err != nil {
		return nil, err.Error()
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Sprintf("stat %s: %v", display(rel), err)
	}
	if why := ns.sameDir(rel, &st, ino); why != "" {
		return nil, why
	}
	d := &nsDir{ino: st.Ino, mode: st.Mode, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), listed: listed}
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, fmt.Sprintf("read %s: %v", display(rel), err)
		}
		if n <= 0 {
			break
		}
		if !parseDirents(buf[:n], func(name string, ino uint64, typ uint8) {
			if name == "." || name == ".." || (rel == "" && name == ".git") {
				return
			}
			d.names = append(d.names, nsName{name: name, ino: ino, typ: typ})
		}) {
			return nil, fmt.Sprintf("read %s: a malformed directory entry", display(rel))
		}
	}
	slices.SortFunc(d.names, func(a, b nsName) int { return strings.Compare(a.name, b.name) })
	d.index()
	return d, ""
}

// parseDirents calls fn for each struct linux_dirent64 in b.
func parseDirents(b []byte, fn func(name string, ino uint64, typ uint8)) bool {
	for len(b) > 0 {
		if len(b) < 19 {
			return false
		}
		ino := binary.NativeEndian.Uint64(b[0:8])
		reclen := int(binary.NativeEndian.Uint16(b[16:18]))
		if reclen < 19 || reclen > len(b) {
			return false
		}
		typ := b[18]
		name := b[19:reclen]
		if i := indexZero(name); i >= 0 {
			name = name[:i]
		}
		fn(string(name), ino, typ)
		b = b[reclen:]
	}
	return true
}

func indexZero(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

// coarse is the coarse clock, the one ctimes are stamped from.
func coarse() (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_REALTIME_COARSE, &ts); err != nil {
		return 0, fmt.Errorf("worktree changes: clock: %w", err)
	}
	return ts.Nano(), nil
}

// Settle takes Ts, the turn's start for the ctime rule: the precise
// clock once the revalidation was done (every change the namespace saw
// has a ctime at or below it), and arms a timer that a step of
// CLOCK_REALTIME cancels (ClockStepped; After then trusts no ctime).
// Call it after the scan before (a walked one gets the timer only); then
// Ready before anything of the turn can run.
func (s *Snapshot) Settle() error {
	if s == nil {
		return nil
	}
	fd, err := unix.TimerfdCreate(unix.CLOCK_REALTIME, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("worktree changes: timerfd: %w", err)
	}
	far := unix.ItimerSpec{Value: unix.Timespec{Sec: 1 << 40}}
	if err := unix.TimerfdSettime(fd, unix.TFD_TIMER_ABSTIME|unix.TFD_TIMER_CANCEL_ON_SET, &far, nil); err != nil {
		unix.Close(fd)
		return fmt.Errorf("worktree changes: timerfd: %w", err)
	}
	armed, err := coarse()
	if err != nil {
		unix.Close(fd)
		return err
	}
	s.clock = &stepTimer{fd: fd, armed: armed}
	if s.ns != nil {
		s.ns.ts, s.ns.clock = s.ns.precise, s.clock
	}
	return nil
}

// stepTimer is a timerfd on CLOCK_REALTIME armed with
// TFD_TIMER_CANCEL_ON_SET: a read fails with ECANCELED once the clock was
// set. The first such read is kept.
type stepTimer struct {
	fd      int
	armed   int64 // the coarse clock read once it was armed
	stepped bool
}

// ClockArmed is the coarse clock read right after Settle armed the step
// timer (0 without Settle): every ctime set later is at or after it, or
// ClockStepped says the clock was set. A rule "ctime from the turn's
// start on" must take its start from here, not before: a step between an
// earlier reading and the arming would go unseen.
func (s *Snapshot) ClockArmed() int64 {
	if s == nil || s.clock == nil {
		return 0
	}
	return s.clock.armed
}

func (t *stepTimer) check() bool {
	if t.fd > 0 && !t.stepped {
		var b [8]byte
		if _, err := unix.Read(t.fd, b[:]); errors.Is(err, unix.ECANCELED) {
			t.stepped = true
		}
	}
	return t.stepped
}

// ClockStepped says whether CLOCK_REALTIME was set since Settle (false
// without Settle): then no "ctime from the turn's start on" rule holds —
// the namespace's, or the idmapped give-back's setuid strip.
func (s *Snapshot) ClockStepped() bool { return s != nil && s.clock != nil && s.clock.check() }

// Ready waits until the coarse clock, which ctimes are stamped from, is
// at Ts: every ctime set from now on is at or after Ts. Call it right
// before the turn can change anything (the cage's start); by then the
// clock has mostly passed Ts (it lags the precise one by a tick at most).
// Without it After trusts no ctime.
func (s *Snapshot) Ready() error {
	if s == nil || s.ns == nil || s.ns.ts == 0 || s.clock == nil {
		return nil
	}
	deadline := time.Now().Add(maxReadyWait)
	for {
		c, err := coarse()
		if err != nil {
			return err
		}
		if c >= s.ns.ts {
			s.ns.ready = true
			return nil
		}
		// The coarse clock lags by a tick at most: a longer wait is a
		// clock set back (the timer says so), and then no ctime is
		// trusted (not ready) rather than the turn held up.
		if s.clock.check() || time.Now().After(deadline) {
			return nil
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// maxReadyWait bounds Ready's wait (a coarse tick is 1–10 ms).
const maxReadyWait = 100 * time.Millisecond

// clockStepped says whether the ctime rule cannot be trusted: the clock
// was set since Settle, or Settle or Ready was not called.
func (ns *Namespace) clockStepped() bool {
	return ns.ts == 0 || !ns.ready || ns.clock == nil || ns.clock.check()
}

// Close releases the snapshot's clock timer and its cache file (nil-safe);
// a listing first needed later fails (Err).
func (s *Snapshot) Close() {
	if s != nil && s.clock != nil && s.clock.fd > 0 {
		unix.Close(s.clock.fd)
		s.clock.fd = -1
	}
	if s != nil && s.ns != nil {
		s.ns.src.close()
	}
}

// Err is why a snapshot from the namespace cannot say what was there
// before: a listing of its cache file, read when first needed, could not
// be read or failed its checksum. Whatever was computed from the snapshot
// is then unknown (fail closed: the turn reports the worktree's changes
// as unknown and gives the worktree back in full). Nil for any other.
func (s *Snapshot) Err() error {
	if s == nil || s.ns == nil || s.ns.src == nil {
		return nil
	}
	return s.ns.src.err
}

// DirsStatted is, for a snapshot before from the namespace, the
// directories below the root it stat-ed itself and those whose stat it
// took from the guard's scan (0, 0 for a walk).
func (s *Snapshot) DirsStatted() (statted, shared int) {
	if s == nil || s.ns == nil {
		return 0, 0
	}
	return s.ns.Statted, s.ns.Shared
}

// Namespace is the namespace a snapshot before was taken from (nil: a full
// walk).
func (s *Snapshot) Namespace() *Namespace { return s.ns }

// lookup is what the namespace names at rel (ok false: nothing).
func (ns *Namespace) lookup(rel string) (nsName, bool) {
	dir, name := path.Split(rel)
	d := ns.dirs[strings.TrimSuffix(dir, "/")]
	if d == nil {
		return nsName{}, false
	}
	names := d.list()
	i, ok := slices.BinarySearchFunc(names, name, func(n nsName, name string) int { return strings.Compare(n.name, name) })
	if !ok {
		return nsName{}, false
	}
	return names[i], true
}

// each calls fn with every path below the directory rel ("" the root).
func (ns *Namespace) each(rel string, fn func(p string, n nsName)) {
	d := ns.dirs[rel]
	if d == nil {
		return
	}
	d.each(func(n nsName) bool {
		p := join(rel, n.name)
		fn(p, n)
		if n.typ == unix.DT_DIR {
			ns.each(p, fn)
		}
		return true
	})
}

// Nested is the nested git repositories the namespace names, by path and
// inode, as worktree's nested-repository finder has them: an entry named
// .git below the root (of any type) or a directory laid out as a git
// directory (HEAD with objects and refs, or with commondir); nothing below
// one is looked at.
func (ns *Namespace) Nested() map[string]uint64 {
	nested := map[string]uint64{}
	var walk func(rel string)
	walk = func(rel string) {
		d := ns.dirs[rel]
		if d == nil {
			return
		}
		if d.dotGit {
			nested[join(rel, ".git")] = d.gitIno
		}
		for _, n := range d.subs {
			if n.name == ".git" {
				continue // the entry above
			}
			p := join(rel, n.name)
			if ns.gitDir(p) {
				nested[p] = n.ino
				continue
			}
			walk(p)
		}
	}
	walk("")
	return nested
}

func (ns *Namespace) gitDir(rel string) bool {
	d := ns.dirs[rel]
	return d != nil && d.layout
}

// typeOf is a DT_* type as S_IFMT bits.
func typeOf(dt uint8) uint32 { return uint32(dt) << 12 }
