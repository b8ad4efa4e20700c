package diff

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/worktree/guard"
)

// The namespace cache file: in the task's trust store (which the cage
// cannot write), a private regular file of the caller's uid. Binary, not
// JSON: 100 000 names are checked in about a millisecond and decoded only
// where needed, and any byte string is a name as it is. Layout (numbers
// little-endian): magic,
// version, worktree path, root device and inode, directory count; per
// directory its path, inode, mode, mtime, ctime, listing time and names
// (name, inode, type); a CRC-32C of all before it.

// NamespaceCacheFile is the cache's name in the trust store.
const NamespaceCacheFile = "namespace-cache"

const (
	nsMagic   = "shrooms-namespace\n"
	nsVersion = 1
	// maxNSCache bounds the cache file read.
	maxNSCache = 512 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// readNamespace reads the cache for the worktree root (device, inode);
// nil with why when it cannot be used.
func readNamespace(p, root string, dev, ino uint64) (map[string]*nsDir, string) {
	data, err := guard.ReadPrivate(p, maxNSCache)
	if errors.Is(err, unix.ENOENT) {
		return nil, "no cache yet"
	}
	if err != nil {
		return nil, err.Error()
	}
	dirs, err := decodeNamespace(data, root, dev, ino)
	if err != nil {
		return nil, err.Error()
	}
	return dirs, ""
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

func decodeNamespace(data []byte, root string, dev, ino uint64) (map[string]*nsDir, error) {
	if len(data) < 4 {
		return nil, errCorrupt
	}
	body := data[:len(data)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(data[len(data)-4:]) {
		return nil, fmt.Errorf("%w (checksum)", errCorrupt)
	}
	// The names are substrings of body, never written again: no copy.
	r := &nsReader{b: body, s: unsafe.String(unsafe.SliceData(body), len(body))}
	if r.take(len(nsMagic)) != nsMagic || r.u32() != nsVersion {
		return nil, errors.New("another format or version")
	}
	if r.str() != root || r.u64() != dev || r.u64() != ino {
		return nil, errors.New("another worktree (path, device or inode)")
	}
	n := int(r.u32())
	if r.bad || n > len(body) {
		return nil, errCorrupt
	}
	dirs := make(map[string]*nsDir, n)
	for range n {
		rel := r.str()
		d := &nsDir{ino: r.u64(), mode: r.u32(), mtime: int64(r.u64()), ctime: int64(r.u64()), listed: int64(r.u64())}
		k := int(r.u32())
		if r.bad || k > len(body) {
			return nil, errCorrupt
		}
		// The names are checked now (bounds, order) and indexed in the
		// same pass (nsDir.subs…), and decoded when first needed
		// (nsDir.list).
		start, prev := r.off, ""
		x := indexer{d: d}
		for i := range k {
			n := nsName{name: r.str(), ino: r.u64(), typ: r.u8()}
			if r.bad {
				return nil, errCorrupt
			}
			if i > 0 && prev >= n.name {
				return nil, fmt.Errorf("%w (listing out of order)", errCorrupt)
			}
			prev = n.name
			if n.typ == unix.DT_DIR || n.typ == unix.DT_UNKNOWN || indexedName(n.name) {
				x.add(n) // a call per name cost 0.3–0.8 ms over 100 000
			}
		}
		x.done()
		d.raw, d.count = r.s[start:r.off], k
		dirs[rel] = d
	}
	if r.off != len(body) {
		return nil, fmt.Errorf("%w (trailing bytes)", errCorrupt)
	}
	return dirs, nil
}

func encodeNamespace(ns *Namespace) []byte {
	b := make([]byte, 0, 64+len(ns.dirs)*64)
	u64 := func(v uint64) { b = binary.LittleEndian.AppendUint64(b, v) }
	u32 := func(v uint32) { b = binary.LittleEndian.AppendUint32(b, v) }
	str := func(s string) { u32(uint32(len(s))); b = append(b, s...) }
	b = append(b, nsMagic...)
	u32(nsVersion)
	str(ns.root)
	u64(ns.rootDev)
	u64(ns.rootIno)
	u32(uint32(len(ns.dirs)))
	for rel, d := range ns.dirs {
		str(rel)
		u64(d.ino)
		u32(d.mode)
		u64(uint64(d.mtime))
		u64(uint64(d.ctime))
		u64(uint64(d.listed))
		u32(uint32(d.len()))
		d.each(func(n nsName) bool {
			str(n.name)
			u64(n.ino)
			b = append(b, n.typ)
			return true
		})
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// Keep writes the namespace revalidated before the turn to its cache file
// when a directory was listed again or went (atomically, mode 0600; no
// trust store yet: nothing). Directories the turn changes need no write:
// their ctime sends them to a new listing next time. Call it off the
// first output's path.
func (s *Snapshot) Keep() error {
	if s == nil || s.ns == nil || !s.ns.changed || s.ns.cachePath == "" {
		return nil
	}
	p := s.ns.cachePath
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := p + "." + hex.EncodeToString(rnd[:])
	if err := os.WriteFile(tmp, encodeNamespace(s.ns), 0o600); err != nil {
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
// it (checked by decodeNamespace), until fn says stop.
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
