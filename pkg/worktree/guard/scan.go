package guard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/shrooms-cage/shrooms/pkg/resolve"
	"golang.org/x/sys/unix"
)

// Limits bound what a scan reads, so a hostile worktree cannot make the
// guard (or a snapshot) unbounded.
const (
	maxFileBytes  = 4 << 20   // one guarded file
	maxRootBytes  = 32 << 20  // one guarded root (a directory's files together)
	maxRootFiles  = 4096      // entries below one guarded directory
	maxWalkDepth  = 128       // directories deep
	maxWalkVisits = 4_000_000 // entries visited in one scan
)

// Entry is one guarded root as found in the worktree.
type Entry struct {
	// Type is "file", "dir", "symlink" or "other" (FIFO, device, socket).
	Type string `json:"type"`
	// Digest is sha256 over the content: a file's bytes and exec bit, a
	// directory's sorted entries (names, types, exec bits, contents), a
	// link's target.
	Digest string `json:"digest"`
	Files  int    `json:"files"`
	Bytes  int64  `json:"bytes"`
	// Oversize is set when the root exceeds the guard's limits; it never
	// matches a trusted version and cannot be trusted.
	Oversize bool `json:"oversize,omitempty"`
	// OutOfTree marks a link (of any name) whose target lies outside the
	// worktree as the cage sees it.
	OutOfTree bool `json:"outOfTree,omitempty"`
}

// Snapshot is every guarded root of a worktree, by worktree-relative path.
type Snapshot struct {
	Entries map[string]Entry `json:"entries"`
	// Visited counts the worktree entries the scan looked at.
	Visited int `json:"visited"`
	// DirsCached and DirsRead count the directories whose listing came
	// from the directory cache and those read (both 0 without one).
	DirsCached int `json:"-"`
	DirsRead   int `json:"-"`
	// matches are the files and links the scan's patterns matched (or
	// could lead on below a link), with the pattern's why.
	matches map[string]string
}

func (s *Snapshot) paths() []string {
	if s == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(s.Entries))
}

// scanner walks a worktree. With copyTo set it also copies the guarded
// roots it hashes (only those in only, when only is non-nil) below copyTo,
// so that a snapshot holds exactly the bytes its digest covers.
type scanner struct {
	ctx      context.Context
	rootFd   int
	copyTo   *os.File
	only     map[string]bool
	patterns []compiledPattern
	snap     *Snapshot
	visited  int
	// cache, when set, stands in for the listing of directories unchanged
	// since the last scan (cache.go).
	cache *dirCache
	// stats, when set (with cache), gets every directory stat the scan
	// takes (DirStats); a later stat of the same directory replaces one.
	stats map[string]unix.Stat_t
}

// Scan finds and hashes every guarded root of worktree.
func Scan(ctx context.Context, worktree string) (*Snapshot, error) {
	return scan(ctx, worktree, nil, nil)
}

func scan(ctx context.Context, worktree string, copyTo *os.File, only map[string]bool) (*Snapshot, error) {
	return scanWith(ctx, worktree, copyTo, only, nil)
}

// scanWith is scan that also collects what patterns match outside the
// guarded roots.
func scanWith(ctx context.Context, worktree string, copyTo *os.File, only map[string]bool, patterns []Pattern) (*Snapshot, error) {
	return scanCached(ctx, worktree, copyTo, only, patterns, "", nil)
}

// scanCached is scanWith with the directory cache kept in cacheDir ("":
// none). With stats set and a cache, the scan's directory stats are put in
// it once the scan succeeded (it is left as it was otherwise).
func scanCached(ctx context.Context, worktree string, copyTo *os.File, only map[string]bool, patterns []Pattern, cacheDir string, stats *DirStats) (*Snapshot, error) {
	fd, err := unix.Open(worktree, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("worktree guard: open %s: %w", worktree, err)
	}
	root := os.NewFile(uintptr(fd), worktree)
	defer root.Close()
	s := &scanner{ctx: ctx, rootFd: int(root.Fd()), copyTo: copyTo, only: only, patterns: compilePatterns(patterns),
		snap: &Snapshot{Entries: map[string]Entry{}, matches: map[string]string{}}}
	if cacheDir != "" {
		s.cache = openCache(cacheDir, worktree, s.rootFd, patterns)
		if s.cache != nil && stats != nil {
			s.stats = make(map[string]unix.Stat_t, len(s.cache.old)+1) // no growth over an unchanged tree
		}
	}
	if err := s.walk(root, "", 0); err != nil {
		return nil, err
	}
	if s.stats != nil {
		stats.dirs = s.stats
	}
	s.snap.Visited = s.visited
	if s.cache != nil {
		s.snap.DirsCached, s.snap.DirsRead = s.cache.hits, s.cache.reads
		// A cache not written costs the next scan its reads, nothing
		// else: any file left is checked record by record against the
		// directories' stat.
		_ = s.cache.save()
	}
	return s.snap, nil
}

func (s *scanner) walk(dir *os.File, rel string, depth int) error {
	if depth > maxWalkDepth {
		return fmt.Errorf("worktree guard: %s is nested more than %d directories deep (refusing to start the turn; flatten or remove it)", rel, maxWalkDepth)
	}
	// The stat is taken before the listing, so a change during it leaves
	// a ctime the record does not have.
	var st unix.Stat_t
	var rec *dirRecord
	if s.cache != nil {
		if err := unix.Fstat(int(dir.Fd()), &st); err != nil {
			return fmt.Errorf("worktree guard: stat %s: %w", displayRel(rel), err)
		}
		if s.stats != nil {
			s.stats[rel] = st
		}
		if r, ok := s.cache.lookup(rel, &st); ok {
			return s.walkCached(dir, rel, depth, r)
		}
		rec = &dirRecord{Matches: map[string]string{}}
	}
	// Directory entry types come from getdents (no stat per entry): the
	// walk's cost on a large worktree is one syscall batch per directory.
	ents, err := dir.ReadDir(-1)
	if err != nil {
		return fmt.Errorf("worktree guard: read %s: %w", displayRel(rel), err)
	}
	if rec != nil {
		rec.Entries = len(ents)
	}
	for _, ent := range ents {
		name := ent.Name()
		if s.visited++; s.visited%1024 == 0 {
			if err := s.ctx.Err(); err != nil {
				return err
			}
		}
		if s.visited > maxWalkVisits {
			return fmt.Errorf("worktree guard: the worktree has more than %d entries (refusing to start the turn)", maxWalkVisits)
		}
		childRel := join(rel, name)
		if isGuardedName(path.Base(rel), name) {
			if err := checkName(childRel); err != nil {
				return err
			}
			dst := s.copyTo
			if s.only != nil && !s.only[childRel] {
				dst = nil // hashed, not copied
			}
			e, err := s.capture(dir, name, childRel, dst)
			if err != nil {
				return err
			}
			s.snap.Entries[childRel] = e
			if rec != nil {
				rec.Guarded = append(rec.Guarded, name)
			}
			continue
		}
		if by := s.match(childRel, ent.Type()); by != "" && rec != nil {
			rec.Matches[name] = by
		}
		if ent.Type()&fs.ModeSymlink != 0 {
			if rec != nil {
				rec.Links = append(rec.Links, name)
			}
			if err := s.link(dir, name, childRel); err != nil {
				return err
			}
			continue
		}
		if name == ".git" || !ent.IsDir() {
			// .git is git metadata: the sealed commit path's business, not
			// config an agent loads.
			continue
		}
		if rec != nil {
			rec.Subdirs = append(rec.Subdirs, name)
		}
		if err := s.walkSub(dir, name, childRel, depth); err != nil {
			return err
		}
	}
	if rec != nil {
		s.cache.store(rel, &st, *rec)
	}
	return nil
}

func (s *scanner) walkSub(dir *os.File, name, childRel string, depth int) error {
	// A cached directory with nothing to open for (no guarded root, link
	// or subdirectory: most of a large tree's leaves) is revalidated by
	// an fstatat of its name, not an open: without following a link, and
	// a mount on it shows another device than the record's (the root's).
	if s.cache != nil && depth < maxWalkDepth {
		var st unix.Stat_t
		if unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			if s.stats != nil {
				s.stats[childRel] = st
			}
			if r, ok := s.cache.peek(childRel, &st); ok && !r.work() {
				s.cache.hit(childRel)
				return s.walkCached(nil, childRel, depth+1, r)
			}
		}
	}
	sub, err := openDirAt(dir, name)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("worktree guard: open %s: %w", childRel, err)
	}
	defer sub.Close()
	return s.walk(sub, childRel, depth+1)
}

// walkCached is walk over the record of an unchanged directory: the
// same steps as the listing would give, the guarded roots hashed and the
// links resolved again (their content is not in the directory's ctime).
func (s *scanner) walkCached(dir *os.File, rel string, depth int, r dirRecord) error {
	s.visited += r.Entries
	if err := s.ctx.Err(); err != nil {
		return err
	}
	if s.visited > maxWalkVisits {
		return fmt.Errorf("worktree guard: the worktree has more than %d entries (refusing to start the turn)", maxWalkVisits)
	}
	for _, name := range r.Guarded {
		childRel := join(rel, name)
		if err := checkName(childRel); err != nil {
			return err
		}
		dst := s.copyTo
		if s.only != nil && !s.only[childRel] {
			dst = nil
		}
		e, err := s.capture(dir, name, childRel, dst)
		if err != nil {
			return err
		}
		s.snap.Entries[childRel] = e
	}
	for name, by := range r.Matches {
		s.snap.matches[join(rel, name)] = by
	}
	for _, name := range r.Links {
		if err := s.link(dir, name, join(rel, name)); err != nil {
			return err
		}
	}
	for _, name := range r.Subdirs {
		if err := s.walkSub(dir, name, join(rel, name), depth); err != nil {
			return err
		}
	}
	return nil
}

// match records a file the scan's patterns match, and a link (or an entry
// of another type) where one matches or could lead on below.
func (s *scanner) match(rel string, typ fs.FileMode) string {
	if path.Base(rel) == ".git" {
		return ""
	}
	if len(s.patterns) == 0 || typ.IsDir() {
		return ""
	}
	segs := strings.Split(rel, "/")
	for _, p := range s.patterns {
		if p.match(segs) || (typ&fs.ModeSymlink != 0 && p.below(segs)) {
			s.snap.matches[rel] = p.by
			return p.by
		}
	}
	return ""
}

// link records a link whose target is outside the worktree: what it points
// at (say a directory the cage left in /outbox, which outlives the turn) is
// read by agents as if it were in the worktree, and the guard cannot see
// it. Links that stay within the worktree are ordinary.
func (s *scanner) link(dir *os.File, name, rel string) error {
	target, err := readlink(dir, name)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("worktree guard: readlink %s: %w", rel, err)
	}
	if !s.escapes(rel, target) {
		return nil
	}
	if err := checkName(rel); err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(target))
	s.snap.Entries[rel] = Entry{Type: "symlink", Digest: "sha256:" + hex.EncodeToString(sum[:]), OutOfTree: true}
	return nil
}

func readlink(dir *os.File, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(int(dir.Fd()), name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// maxLinkHops bounds link resolution, as the kernel's own limit does.
const maxLinkHops = 40

// escapes reports whether the link at rel (worktree-relative) resolves
// outside the worktree as the cage sees it (mounted at /work). It resolves
// the way the kernel will in the cage, component by component, following
// the links it meets (each read with readlinkat, nothing opened), so a
// chain such as a -> b/../outbox with b -> /work leaves the tree here as it
// would in the cage.
func (s *scanner) escapes(rel, target string) bool {
	var base []string
	if d := path.Dir(rel); d != "." {
		base = strings.Split(d, "/")
	}
	hops := 0
	_, escaped := s.follow(base, target, &hops)
	return escaped
}

// follow resolves target from the directory base (components below the
// worktree root, each a real directory) and returns the components it
// leads to, or escaped. A path that runs into a missing entry is judged by
// what is left of it, lexically (the cage would fail the same way, or
// create an entry inside the tree).
func (s *scanner) follow(base []string, target string, hops *int) ([]string, bool) {
	if *hops++; *hops > maxLinkHops {
		return nil, true // a loop: refused, as the kernel would fail it
	}
	var cur []string
	if path.IsAbs(target) {
		t := path.Clean(target)
		if t != "/work" && !strings.HasPrefix(t, "/work/") {
			return nil, true
		}
		target = strings.TrimPrefix(strings.TrimPrefix(t, "/work"), "/")
	} else {
		cur = append(cur, base...)
	}
	parts := strings.Split(target, "/")
	for i, part := range parts {
		switch part {
		case "", ".":
			continue
		case "..":
			if len(cur) == 0 {
				return nil, true
			}
			cur = cur[:len(cur)-1]
			continue
		}
		p := strings.Join(append(append([]string{}, cur...), part), "/")
		var st unix.Stat_t
		if err := unix.Fstatat(s.rootFd, p, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			rest := path.Join(append([]string{"/work"}, append(append([]string{}, cur...), parts[i:]...)...)...)
			if rest != "/work" && !strings.HasPrefix(rest, "/work/") {
				return nil, true
			}
			return strings.Split(strings.TrimPrefix(rest, "/work/"), "/"), false
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			cur = append(cur, part)
			continue
		}
		// Every component of p but the last is a real directory, so this
		// reads the link itself and follows nothing.
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(s.rootFd, p, buf)
		if err != nil {
			return nil, true
		}
		next, escaped := s.follow(cur, string(buf[:n]), hops)
		if escaped {
			return nil, true
		}
		cur = next
	}
	return cur, false
}

// capture hashes the guarded root dir/name and, with dst set, copies it to
// dst under the root's relative path.
func (s *scanner) capture(dir *os.File, name, rel string, dst *os.File) (Entry, error) {
	h := sha256.New()
	c := &capturer{h: h}
	var dstParent *os.File
	if dst != nil {
		p, err := mkdirAllAt(dst, path.Dir(rel))
		if err != nil {
			return Entry{}, fmt.Errorf("worktree guard: snapshot %s: %w", rel, err)
		}
		defer func() {
			if p != dst {
				p.Close()
			}
		}()
		dstParent = p
	}
	typ, err := c.node(dir, name, "", dstParent, path.Base(rel), 0)
	if err != nil {
		return Entry{}, fmt.Errorf("worktree guard: %s: %w", rel, err)
	}
	e := Entry{Type: typ, Files: c.files, Bytes: c.bytes, Oversize: c.oversize}
	e.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	if c.oversize && dst != nil {
		return Entry{}, fmt.Errorf("worktree guard: %s is over the guard's limits (%d files, %d bytes in a directory, %d bytes a file) and cannot be trusted; shrink or remove it", rel, maxRootFiles, maxRootBytes, maxFileBytes)
	}
	return e, nil
}

type capturer struct {
	h        hash.Hash
	files    int
	bytes    int64
	oversize bool
}

// node hashes one entry (rel is its path inside the root, "" for the root
// itself) and copies it into dstDir/dstName when dstDir is set.
func (c *capturer) node(dir *os.File, name, rel string, dstDir *os.File, dstName string, depth int) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return "", fmt.Errorf("stat %s: %w", displayRel(rel), err)
	}
	c.files++
	if c.files > maxRootFiles {
		c.oversize = true
		return typeOf(st.Mode), nil
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		exec := st.Mode&0o111 != 0
		fmt.Fprintf(c.h, "F %q %t ", rel, exec)
		if st.Size > maxFileBytes || c.bytes+st.Size > maxRootBytes {
			c.oversize = true
			fmt.Fprintf(c.h, "oversize %d\n", st.Size)
			return "file", nil
		}
		data, err := readFileAt(dir, name, maxFileBytes)
		if err != nil {
			return "", fmt.Errorf("read %s: %w", displayRel(rel), err)
		}
		c.bytes += int64(len(data))
		fmt.Fprintf(c.h, "%d\n", len(data))
		c.h.Write(data)
		if dstDir != nil {
			mode := uint32(0o644)
			if exec {
				mode = 0o755
			}
			if err := writeFileAt(dstDir, dstName, data, mode); err != nil {
				return "", fmt.Errorf("snapshot %s: %w", displayRel(rel), err)
			}
		}
		return "file", nil
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(int(dir.Fd()), name, buf)
		if err != nil {
			return "", fmt.Errorf("readlink %s: %w", displayRel(rel), err)
		}
		target := string(buf[:n])
		fmt.Fprintf(c.h, "L %q %q\n", rel, target)
		if dstDir != nil {
			if err := unix.Symlinkat(target, int(dstDir.Fd()), dstName); err != nil {
				return "", fmt.Errorf("snapshot %s: %w", displayRel(rel), err)
			}
		}
		return "symlink", nil
	case unix.S_IFDIR:
		if depth > maxWalkDepth {
			c.oversize = true
			return "dir", nil
		}
		fmt.Fprintf(c.h, "D %q\n", rel)
		sub, err := openDirAt(dir, name)
		if err != nil {
			return "", fmt.Errorf("open %s: %w", displayRel(rel), err)
		}
		defer sub.Close()
		var dstSub *os.File
		if dstDir != nil {
			if err := unix.Mkdirat(int(dstDir.Fd()), dstName, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				return "", fmt.Errorf("snapshot %s: %w", displayRel(rel), err)
			}
			if dstSub, err = openDirAt(dstDir, dstName); err != nil {
				return "", fmt.Errorf("snapshot %s: %w", displayRel(rel), err)
			}
			defer dstSub.Close()
			if err := unix.Fchmod(int(dstSub.Fd()), 0o755); err != nil {
				return "", fmt.Errorf("snapshot %s: %w", displayRel(rel), err)
			}
		}
		names, err := readNames(sub)
		if err != nil {
			return "", fmt.Errorf("read %s: %w", displayRel(rel), err)
		}
		for _, n := range names {
			if _, err := c.node(sub, n, join(rel, n), dstSub, n, depth+1); err != nil {
				return "", err
			}
			if c.oversize {
				return "dir", nil
			}
		}
		return "dir", nil
	default:
		// Never opened: a FIFO could block, a device is not ours to touch.
		fmt.Fprintf(c.h, "O %q %o\n", rel, st.Mode&unix.S_IFMT)
		if dstDir != nil {
			return "", fmt.Errorf("%s is a %s; only files, directories and links can be trusted", displayRel(rel), typeOf(st.Mode))
		}
		return "other", nil
	}
}

func typeOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	}
	return "other"
}

// checkName refuses paths a mount destination or a report line could not
// carry faithfully.
func checkName(rel string) error {
	if !utf8.ValidString(rel) || strings.ContainsFunc(rel, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("worktree guard: a guarded path has control characters or invalid UTF-8 (%q); remove it before the next turn", rel)
	}
	return nil
}

func join(rel, name string) string {
	if rel == "" {
		return name
	}
	return rel + "/" + name
}

func displayRel(rel string) string {
	if rel == "" {
		return "."
	}
	return rel
}

// readNames lists a directory, sorted.
func readNames(dir *os.File) ([]string, error) {
	if _, err := dir.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	var names []string
	for {
		batch, err := dir.Readdirnames(4096)
		names = append(names, batch...)
		if err == io.EOF || len(batch) == 0 {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	slices.Sort(names)
	return names, nil
}

func openat2(dir *os.File, name string, flags uint64) (int, error) {
	for {
		fd, err := unix.Openat2(int(dir.Fd()), name, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: resolve.BeneathAnyMount})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// openDirAt opens dir/name as a directory, never through a link.
func openDirAt(dir *os.File, name string) (*os.File, error) {
	fd, err := openat2(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// readFileAt reads the regular file dir/name (at most max bytes). O_NONBLOCK
// and the type check after open mean a FIFO swapped in cannot block it.
func readFileAt(dir *os.File, name string, max int64) ([]byte, error) {
	fd, err := openat2(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, errors.New("not a regular file")
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("over %d bytes", max)
	}
	return data, nil
}

// writeFileAt creates dir/name (which must not exist) with data and mode.
func writeFileAt(dir *os.File, name string, data []byte, mode uint32) error {
	fd, err := openat2(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// mkdirAllAt creates rel (slash-separated, "." for dir itself) below dir
// and returns it open.
func mkdirAllAt(dir *os.File, rel string) (*os.File, error) {
	if rel == "." || rel == "" {
		return dir, nil
	}
	cur := dir
	for _, seg := range strings.Split(rel, "/") {
		if err := unix.Mkdirat(int(cur.Fd()), seg, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			if cur != dir {
				cur.Close()
			}
			return nil, err
		}
		next, err := openDirAt(cur, seg)
		if cur != dir {
			cur.Close()
		}
		if err != nil {
			return nil, err
		}
		if err := unix.Fchmod(int(next.Fd()), 0o755); err != nil {
			next.Close()
			return nil, err
		}
		cur = next
	}
	return cur, nil
}
