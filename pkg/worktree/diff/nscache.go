package diff

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/worktree/guard"
)

// The namespace cache file: in the task's trust store (which the cage
// cannot write), a private regular file of the caller's uid. Binary, not
// JSON, and in two parts so that the revalidation before a turn reads only
// the first: the index — per directory what the revalidation and Nested
// need (stat, listing time, entry count, subdirectories, git layout) —
// and the listings, read one directory at a time when first needed (after
// the turn, for the directories its events name) from the file kept open
// since the index was read. Layout (numbers little-endian): magic,
// version, the index's length; the index: worktree path, root device and
// inode, directory count, per directory its path, inode, mode, mtime,
// ctime, listing time, entry count, flags, inode of its .git entry,
// subdirectories (name, inode, type) and its listing's offset, length and
// CRC-32C; the inode filter's offset, length and CRC-32C; a CRC-32C of the
// index. Then the listings (per entry: name, inode, type, sorted by name)
// and the inode filter (nsfilter.go).

// NamespaceCacheFile is the cache's name in the trust store.
const NamespaceCacheFile = "namespace-cache"

const (
	nsMagic   = "shrooms-namespace\n"
	nsVersion = 2
	// maxNSCache bounds the cache file.
	maxNSCache = 512 << 20
	// nsHeader is the magic, the version and the index's length.
	nsHeader = len(nsMagic) + 8
)

// Flags of a directory in the index.
const (
	nsUnknown = 1 << iota // an entry of unknown type
	nsDotGit              // an entry named .git
	nsLayout              // laid out as a git directory
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// nsSource is the cache file a namespace's listings are read from, open
// from the index's read on (a file written since is another inode: this
// one stays as it was read), until the snapshot is closed. A listing that
// cannot be read or fails its checksum makes err: the namespace then
// fails closed (Snapshot.Err).
type nsSource struct {
	f      *os.File
	base   int64 // where the listings start
	size   int64 // the listings' and the filter's length
	filter nsExtent
	err    error
}

// nsExtent is a part of the listings: offset from base, length, checksum.
type nsExtent struct {
	off int64
	n   uint32
	crc uint32
}

// read returns the bytes of x, checked against its checksum; the first
// failure is kept.
func (src *nsSource) read(x nsExtent) ([]byte, error) {
	if src.err != nil {
		return nil, src.err
	}
	if src.f == nil {
		src.err = errors.New("namespace cache: read after the snapshot was closed")
		return nil, src.err
	}
	if x.off < 0 || x.off+int64(x.n) > src.size {
		src.err = fmt.Errorf("namespace cache: %w (a part past the file's end)", errCorrupt)
		return nil, src.err
	}
	b := make([]byte, x.n)
	if _, err := src.f.ReadAt(b, src.base+x.off); err != nil {
		src.err = fmt.Errorf("namespace cache: read: %w", err)
		return nil, src.err
	}
	if crc32.Checksum(b, castagnoli) != x.crc {
		src.err = fmt.Errorf("namespace cache: %w (checksum of a listing)", errCorrupt)
		return nil, src.err
	}
	return b, nil
}

func (src *nsSource) close() {
	if src != nil && src.f != nil {
		src.f.Close()
		src.f = nil
	}
}

// readNamespace reads the cache's index for the worktree root (device,
// inode), keeping the file open for the listings; nil with why when it
// cannot be used.
func readNamespace(p, root string, dev, ino uint64) (map[string]*nsDir, *nsSource, string) {
	f, size, err := guard.OpenPrivate(p, maxNSCache)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil, "no cache yet"
	}
	if err != nil {
		return nil, nil, err.Error()
	}
	dirs, src, err := decodeIndex(f, size, root, dev, ino)
	if err != nil {
		f.Close()
		return nil, nil, err.Error()
	}
	return dirs, src, ""
}

var errCorrupt = errors.New("corrupt")

// nsReader reads the cache's fields: numbers from b, names as substrings
// of s (the same bytes).
type nsReader struct {
	b   []byte
	s   string
	off int
	bad bool
}

func (r *nsReader) next(n int) (int, bool) {
	if r.bad || n < 0 || r.off+n > len(r.b) {
		r.bad = true
		return 0, false
	}
	o := r.off
	r.off += n
	return o, true
}

func (r *nsReader) take(n int) string {
	o, ok := r.next(n)
	if !ok {
		return ""
	}
	return r.s[o : o+n]
}

func (r *nsReader) u64() uint64 {
	o, ok := r.next(8)
	if !ok {
		return 0
	}
	return binary.LittleEndian.Uint64(r.b[o:])
}

func (r *nsReader) u32() uint32 {
	o, ok := r.next(4)
	if !ok {
		return 0
	}
	return binary.LittleEndian.Uint32(r.b[o:])
}

func (r *nsReader) u8() uint8 {
	o, ok := r.next(1)
	if !ok {
		return 0
	}
	return r.b[o]
}

func (r *nsReader) str() string { return r.take(int(r.u32())) }

func (r *nsReader) extent() nsExtent {
	return nsExtent{off: int64(r.u64()), n: r.u32(), crc: r.u32()}
}

// newReader reads b; the names are substrings of it, never written
// again: no copy.
func newReader(b []byte) *nsReader {
	return &nsReader{b: b, s: unsafe.String(unsafe.SliceData(b), len(b))}
}

// decodeIndex reads and checks the header and the index of the cache file
// f (size bytes); the listings stay in the file.
func decodeIndex(f *os.File, size int64, root string, dev, ino uint64) (map[string]*nsDir, *nsSource, error) {
	head := make([]byte, nsHeader)
	if _, err := f.ReadAt(head, 0); err != nil {
		return nil, nil, fmt.Errorf("%w (header: %v)", errCorrupt, err)
	}
	h := newReader(head)
	if h.take(len(nsMagic)) != nsMagic || h.u32() != nsVersion {
		return nil, nil, errors.New("another format or version")
	}
	n := int64(h.u32())
	if n < 4 || int64(nsHeader)+n > size {
		return nil, nil, fmt.Errorf("%w (index length)", errCorrupt)
	}
	data := make([]byte, n)
	if _, err := f.ReadAt(data, int64(nsHeader)); err != nil {
		return nil, nil, fmt.Errorf("%w (index: %v)", errCorrupt, err)
	}
	body := data[:len(data)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(data[len(data)-4:]) {
		return nil, nil, fmt.Errorf("%w (checksum)", errCorrupt)
	}
	r := newReader(body)
	if r.str() != root || r.u64() != dev || r.u64() != ino {
		return nil, nil, errors.New("another worktree (path, device or inode)")
	}
	count := int(r.u32())
	if r.bad || count > len(body) {
		return nil, nil, errCorrupt
	}
	src := &nsSource{f: f, base: int64(nsHeader) + n, size: size - int64(nsHeader) - n}
	// The listings are laid end to end, in the index's order, then the
	// filter: each extent must start where the one before ended, and the
	// last end at the file's end (a truncated or grown file is corrupt).
	var end int64
	dirs := make(map[string]*nsDir, count)
	for range count {
		rel := r.str()
		d := &nsDir{ino: r.u64(), mode: r.u32(), mtime: int64(r.u64()), ctime: int64(r.u64()), listed: int64(r.u64())}
		d.count = int(r.u32())
		flags := r.u8()
		d.unknown, d.dotGit, d.layout = flags&nsUnknown != 0, flags&nsDotGit != 0, flags&nsLayout != 0
		d.gitIno = r.u64()
		k := int(r.u32())
		if r.bad || k > len(body) {
			return nil, nil, errCorrupt
		}
		for range k {
			d.subs = append(d.subs, nsName{name: r.str(), ino: r.u64(), typ: r.u8()})
		}
		x := r.extent()
		if r.bad || x.off != end || d.count > int(x.n) {
			return nil, nil, errCorrupt
		}
		end += int64(x.n)
		d.lazy, d.cached = &nsLazy{src: src, at: x}, true
		dirs[rel] = d
	}
	src.filter = r.extent()
	if r.bad || r.off != len(body) || src.filter.off != end || end+int64(src.filter.n) != src.size {
		return nil, nil, fmt.Errorf("%w (trailing bytes or length)", errCorrupt)
	}
	return dirs, src, nil
}

// nsLazy is where a directory's listing waits in the cache file.
type nsLazy struct {
	src *nsSource
	at  nsExtent
}

// load reads the directory's listing from the cache file if it is still
// there; false when it cannot be read (the source's err says why, and the
// namespace fails closed).
func (d *nsDir) load() bool {
	if d.lazy == nil {
		return true
	}
	lz := d.lazy
	d.lazy = nil
	b, err := lz.src.read(lz.at)
	if err == nil {
		err = checkListing(b, d.count)
		if err != nil {
			lz.src.err = fmt.Errorf("namespace cache: %w", err)
		}
	}
	if err != nil {
		d.raw, d.count, d.names = "", 0, nil
		return false
	}
	d.raw = unsafe.String(unsafe.SliceData(b), len(b))
	return true
}

// checkListing checks a listing read from the cache: count entries in
// bounds, sorted by name, nothing after them.
func checkListing(b []byte, count int) error {
	r := newReader(b)
	prev := ""
	for i := range count {
		name := r.str()
		r.u64()
		r.u8()
		if r.bad {
			return errCorrupt
		}
		if i > 0 && prev >= name {
			return fmt.Errorf("%w (listing out of order)", errCorrupt)
		}
		prev = name
	}
	if r.off != len(b) {
		return fmt.Errorf("%w (trailing bytes in a listing)", errCorrupt)
	}
	return nil
}

// encodeNamespace is the cache file of ns (false: a listing could not be
// read from the old file, nothing to write).
func encodeNamespace(ns *Namespace) ([]byte, bool) {
	rels := make([]string, 0, len(ns.dirs))
	for rel := range ns.dirs {
		rels = append(rels, rel)
	}
	slices.Sort(rels)
	var listings []byte
	ix := make([]byte, 0, 64+len(ns.dirs)*96)
	u64 := func(v uint64) { ix = binary.LittleEndian.AppendUint64(ix, v) }
	u32 := func(v uint32) { ix = binary.LittleEndian.AppendUint32(ix, v) }
	str := func(s string) { u32(uint32(len(s))); ix = append(ix, s...) }
	extent := func(b []byte) {
		u64(uint64(len(listings)))
		u32(uint32(len(b)))
		u32(crc32.Checksum(b, castagnoli))
		listings = append(listings, b...)
	}
	str(ns.root)
	u64(ns.rootDev)
	u64(ns.rootIno)
	u32(uint32(len(rels)))
	total := 0
	for _, d := range ns.dirs {
		total += d.len()
	}
	filter := newInoFilter(total)
	var l []byte
	for _, rel := range rels {
		d := ns.dirs[rel]
		if !d.load() {
			return nil, false
		}
		str(rel)
		u64(d.ino)
		u32(d.mode)
		u64(uint64(d.mtime))
		u64(uint64(d.ctime))
		u64(uint64(d.listed))
		u32(uint32(d.len()))
		var flags uint8
		if d.unknown {
			flags |= nsUnknown
		}
		if d.dotGit {
			flags |= nsDotGit
		}
		if d.layout {
			flags |= nsLayout
		}
		ix = append(ix, flags)
		u64(d.gitIno)
		u32(uint32(len(d.subs)))
		for _, n := range d.subs {
			str(n.name)
			u64(n.ino)
			ix = append(ix, n.typ)
		}
		l = l[:0]
		d.each(func(n nsName) bool {
			l = binary.LittleEndian.AppendUint32(l, uint32(len(n.name)))
			l = append(l, n.name...)
			l = binary.LittleEndian.AppendUint64(l, n.ino)
			l = append(l, n.typ)
			if n.typ != unix.DT_DIR {
				filter.add(n.ino)
			}
			return true
		})
		extent(l)
	}
	extent(filter.bytes())
	ix = binary.LittleEndian.AppendUint32(ix, crc32.Checksum(ix, castagnoli))
	b := make([]byte, 0, nsHeader+len(ix)+len(listings))
	b = append(b, nsMagic...)
	b = binary.LittleEndian.AppendUint32(b, nsVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ix)))
	b = append(b, ix...)
	return append(b, listings...), true
}

// Keep writes the namespace revalidated before the turn to its cache file
// when a directory was listed again or went (atomically, mode 0600; no
// trust store yet: nothing). Directories the turn changes need no write:
// their ctime sends them to a new listing next time. Call it off the
// first output's path.
func (s *Snapshot) Keep() error {
	if s == nil || s.ns == nil || s.ns.cachePath == "" {
		return nil
	}
	p := s.ns.cachePath
	if err := s.Err(); err != nil {
		// A listing of the file read no more: the next turn lists all.
		if rerr := os.Remove(p); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return fmt.Errorf("worktree changes: remove namespace cache: %w", rerr)
		}
		return fmt.Errorf("worktree changes: %w", err)
	}
	if !s.ns.changed {
		return nil
	}
	data, ok := encodeNamespace(s.ns)
	if !ok {
		return s.Keep() // the failure just recorded: the file goes
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := p + "." + hex.EncodeToString(rnd[:])
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		os.Remove(tmp)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("worktree changes: write namespace cache: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("worktree changes: write namespace cache: %w", err)
	}
	s.ns.changed = false
	return nil
}

// eachRaw calls fn with each entry of a listing as the cache file holds
// it (checked by load), until fn says stop.
func eachRaw(raw string, fn func(nsName) bool) {
	for i := 0; i+4 <= len(raw); {
		l := int(le32(raw, i))
		i += 4
		n := nsName{name: raw[i : i+l], ino: uint64(le32(raw, i+l)) | uint64(le32(raw, i+l+4))<<32, typ: raw[i+l+8]}
		i += l + 9
		if !fn(n) {
			return
		}
	}
}

func le32(s string, i int) uint32 {
	return uint32(s[i]) | uint32(s[i+1])<<8 | uint32(s[i+2])<<16 | uint32(s[i+3])<<24
}
