package guard

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// The directory cache lets the guard's scan skip the readdir of worktree
// directories unchanged since the task's last turn, as git's untracked
// cache does. What the walk learns from a directory's listing — how many
// entries, which are guarded roots, links, subdirectories to descend into,
// pattern matches — depends only on the directory's path and its entries'
// names and types; those change only with an entry added, removed or
// renamed in it, which sets the directory's ctime (the kernel's clock;
// touch -d sets mtime but moves ctime to now). So a record is reused only
// for the same path, device, inode, mtime and ctime. Everything else the
// guard decides on is read again on every scan: guarded roots are hashed,
// links read and resolved, loads (imports, instructions) read by
// guardLoads. The cache lives in the task's trust store (the task state
// directory, which the cage cannot write).
//
// It fails closed: a cache file that is missing, unreadable, corrupt, not
// the caller's own with mode 0600, of another worktree root (path, device
// or inode), another pattern set, guarded-name table or version, or a worktree on a filesystem
// not known to keep ctime from the local clock is ignored, and the scan
// reads every directory. A directory changed within racyWindow of the
// scan (its ctime could still be equal after a later change in the same
// clock tick) or on another device than the root is never recorded; a
// ctime ahead of the clock discards the whole cache.

const (
	cacheFile    = "guard-cache"
	cacheVersion = 2
	// legacyCacheFile is version 1's JSON cache, removed when a new one is
	// written (decoding its JSON was half the cached scan's time).
	legacyCacheFile = "guard-cache.json"
	racyWindow      = time.Second
	maxCacheSize    = 256 << 20
)

// dirRecord is what the walk took from one directory's listing.
type dirRecord struct {
	Dev, Ino       uint64
	Mtime, Ctime   int64
	Entries        int
	Guarded, Links []string
	Subdirs        []string
	Matches        map[string]string
}

// work reports whether the walk needs the directory open for its record:
// a guarded root to hash, a link to read, a directory to descend into.
func (r *dirRecord) work() bool { return len(r.Guarded)+len(r.Links)+len(r.Subdirs) > 0 }

type cacheData struct {
	Version  int
	Worktree string
	RootDev  uint64
	RootIno  uint64
	Patterns string
	Dirs     map[string]dirRecord
}

// dirCache is one scan's view of the cache: old records to reuse, the
// records to save for the next scan.
type dirCache struct {
	path string
	head cacheData
	old  map[string]dirRecord
	next map[string]dirRecord // the records read again by this scan
	// hitRels are the directories whose old record this scan used: with
	// next, the records saved (a map of them built only when there is
	// something to save).
	hitRels []string
	now     int64 // scan start, ns since the epoch
	doubt   bool  // a ctime ahead of the clock: save nothing
	hits    int
	reads   int
	rootDev uint64
}

// LocalTimeFS reports whether a filesystem's timestamps come from this
// kernel's clock (not a server's) with ctime kept on every entry change:
// the filesystems a cache keyed by ctime may trust (this one, and the
// worktree change scan's namespace cache).
func LocalTimeFS(magic int64) bool {
	switch magic {
	case unix.EXT4_SUPER_MAGIC, unix.XFS_SUPER_MAGIC, unix.BTRFS_SUPER_MAGIC, unix.TMPFS_MAGIC:
		return true
	}
	return false
}

// rulesDigest keys the cache to what the walk decides by besides the
// directory's entries: the owner's patterns and this binary's guarded
// names (a record says which of its names were guarded; one written by a
// shrooms with fewer names would hide a newly guarded file in every
// directory unchanged since).
func rulesDigest(patterns []Pattern, names []guarded) string {
	h := sha256.New()
	b, _ := json.Marshal(patterns)
	h.Write(b)
	for _, g := range names {
		fmt.Fprintf(h, "\x00%q %q", g.parent, g.name)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// openCache loads the cache for the worktree open at rootFd from dir
// (the trust store). It returns nil (no caching) when the worktree's
// filesystem cannot be trusted for it; an unusable file gives an empty
// cache that the scan fills.
func openCache(dir, worktree string, rootFd int, patterns []Pattern) *dirCache {
	var sfs unix.Statfs_t
	var st unix.Stat_t
	if dir == "" || unix.Fstatfs(rootFd, &sfs) != nil || !LocalTimeFS(int64(sfs.Type)) || unix.Fstat(rootFd, &st) != nil {
		return nil
	}
	c := &dirCache{
		path: filepath.Join(dir, cacheFile),
		head: cacheData{Version: cacheVersion, Worktree: worktree, RootDev: st.Dev, RootIno: st.Ino, Patterns: rulesDigest(patterns, guardedNames())},
		next: map[string]dirRecord{}, now: time.Now().UnixNano(), rootDev: st.Dev,
	}
	if d, err := readCache(c.path); err == nil && d.Version == c.head.Version && d.Worktree == c.head.Worktree &&
		d.RootDev == c.head.RootDev && d.RootIno == c.head.RootIno && d.Patterns == c.head.Patterns {
		c.old = d.Dirs
		c.hitRels = make([]string, 0, len(d.Dirs))
	}
	return c
}

// readCache reads the cache file only if it is a regular file of the
// caller's uid that nobody else can write or read.
func readCache(p string) (*cacheData, error) {
	data, err := ReadPrivate(p, maxCacheSize)
	if err != nil {
		return nil, err
	}
	return decodeCache(data)
}

// ReadPrivate reads the file p, never through a link, only if it is a
// regular file of the caller's uid that nobody else can read or write,
// of at most max bytes: a cache the caller keeps in a task's trust store.
func ReadPrivate(p string, max int64) ([]byte, error) {
	f, size, err := OpenPrivate(p, max)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// One read of the size the stat gave (a file that grew since fails).
	data := make([]byte, size+1)
	n, err := io.ReadFull(f, data)
	if !errors.Is(err, io.ErrUnexpectedEOF) && !(err == io.EOF && size == 0) {
		return nil, fmt.Errorf("read %s: %d of %d bytes, %v", p, n, size, err)
	}
	if int64(n) != size {
		return nil, fmt.Errorf("read %s: %d of %d bytes", p, n, size)
	}
	return data[:n], nil
}

// OpenPrivate opens p for reading as ReadPrivate reads it (never through
// a link, a private regular file of the caller's uid, at most max bytes)
// and returns its size.
func OpenPrivate(p string, max int64) (*os.File, int64, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, err
	}
	f := os.NewFile(uintptr(fd), p)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != uint32(os.Geteuid()) || st.Mode&0o077 != 0 || st.Size > max {
		f.Close()
		return nil, 0, errors.New("not a private regular file of this user")
	}
	return f, st.Size, nil
}

func statNs(ts unix.Timespec) int64 { return ts.Sec*1e9 + ts.Nsec }

// lookup returns the record for the directory rel with stat st, if it is
// still exact.
func (c *dirCache) lookup(rel string, st *unix.Stat_t) (dirRecord, bool) {
	r, ok := c.peek(rel, st)
	if !ok {
		c.reads++
		return dirRecord{}, false
	}
	c.hit(rel)
	return r, true
}

// peek is lookup without counting or keeping the record.
func (c *dirCache) peek(rel string, st *unix.Stat_t) (dirRecord, bool) {
	r, ok := c.old[rel]
	if !ok || st.Mode&unix.S_IFMT != unix.S_IFDIR || r.Dev != st.Dev || r.Ino != st.Ino || r.Mtime != statNs(st.Mtim) || r.Ctime != statNs(st.Ctim) {
		return dirRecord{}, false
	}
	return r, true
}

// hit counts a record used and keeps it for the next scan.
func (c *dirCache) hit(rel string) {
	c.hits++
	c.hitRels = append(c.hitRels, rel)
}

// store keeps the record of a directory just read, with st its stat taken
// before the read, unless the directory changed too recently to tell a
// later change from this one.
func (c *dirCache) store(rel string, st *unix.Stat_t, r dirRecord) {
	ct, mt := statNs(st.Ctim), statNs(st.Mtim)
	if ct > c.now+int64(racyWindow) {
		c.doubt = true
	}
	if st.Dev != c.rootDev || ct > c.now-int64(racyWindow) || mt > c.now-int64(racyWindow) {
		return
	}
	r.Dev, r.Ino, r.Mtime, r.Ctime = st.Dev, st.Ino, mt, ct
	c.next[rel] = r
}

// save writes the records for the next scan (atomically, mode 0600), or
// removes the file when the clock is in doubt.
func (c *dirCache) save() error {
	if c.doubt {
		if err := os.Remove(c.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("worktree guard: remove cache: %w", err)
		}
		return nil
	}
	if c.reads == 0 && c.hits == len(c.old) {
		return nil // nothing new: every directory came from the cache
	}
	for _, rel := range c.hitRels {
		c.next[rel] = c.old[rel]
	}
	d := c.head
	d.Dirs = c.next
	data := encodeCache(&d)
	_ = os.Remove(filepath.Join(filepath.Dir(c.path), legacyCacheFile))
	tmp := c.path + "." + randHex()
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		os.Remove(tmp)
		if errors.Is(err, os.ErrNotExist) {
			return nil // no trust store yet: nothing to keep it in
		}
		return fmt.Errorf("worktree guard: write cache: %w", err)
	}
	if err := os.Rename(tmp, c.path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("worktree guard: write cache: %w", err)
	}
	return nil
}
