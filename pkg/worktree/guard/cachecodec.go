package guard

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"maps"
	"slices"
)

// The directory cache's file is binary, not JSON: decoding 1 000 records
// as JSON was half of a cached scan's time, and any byte string is a name
// as it is (JSON would turn invalid UTF-8 into another name). Layout:
// magic, then unsigned varints and strings (a varint length, the bytes):
// version, worktree, root device and inode, patterns digest, directory
// count; per directory its path, device, inode, mtime, ctime (as
// unsigned), entry count, the guarded, link and subdirectory names (each
// a count and the names) and the matches (a count, name and pattern
// owner pairs); last a CRC-32C of all before it, 4 bytes little-endian.

const cacheMagic = "shrooms-guard-cache\n"

var cacheCRC = crc32.MakeTable(crc32.Castagnoli)

func encodeCache(d *cacheData) []byte {
	b := append([]byte(nil), cacheMagic...)
	str := func(s string) { b = binary.AppendUvarint(b, uint64(len(s))); b = append(b, s...) }
	strs := func(ss []string) {
		b = binary.AppendUvarint(b, uint64(len(ss)))
		for _, s := range ss {
			str(s)
		}
	}
	b = binary.AppendUvarint(b, uint64(d.Version))
	str(d.Worktree)
	b = binary.AppendUvarint(b, d.RootDev)
	b = binary.AppendUvarint(b, d.RootIno)
	str(d.Patterns)
	b = binary.AppendUvarint(b, uint64(len(d.Dirs)))
	for _, rel := range slices.Sorted(maps.Keys(d.Dirs)) {
		r := d.Dirs[rel]
		str(rel)
		for _, n := range []uint64{r.Dev, r.Ino, uint64(r.Mtime), uint64(r.Ctime), uint64(r.Entries)} {
			b = binary.AppendUvarint(b, n)
		}
		strs(r.Guarded)
		strs(r.Links)
		strs(r.Subdirs)
		b = binary.AppendUvarint(b, uint64(len(r.Matches)))
		for _, n := range slices.Sorted(maps.Keys(r.Matches)) {
			str(n)
			str(r.Matches[n])
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, cacheCRC))
}

var errCacheCorrupt = errors.New("worktree guard: cache corrupt")

// cacheReader reads the fields of b; names are substrings of s (the same
// bytes, one copy for the whole file).
type cacheReader struct {
	b   []byte
	s   string
	off int
	bad bool
}

func (r *cacheReader) num() uint64 {
	if r.bad {
		return 0
	}
	n, k := binary.Uvarint(r.b[r.off:])
	if k <= 0 {
		r.bad = true
		return 0
	}
	r.off += k
	return n
}

// count is a number of items that each take at least one byte.
func (r *cacheReader) count() int {
	n := r.num()
	if n > uint64(len(r.b)-r.off) {
		r.bad = true
		return 0
	}
	return int(n)
}

func (r *cacheReader) str() string {
	n := r.count()
	if r.bad {
		return ""
	}
	s := r.s[r.off : r.off+n]
	r.off += n
	return s
}

func (r *cacheReader) strs() []string {
	n := r.count()
	if n == 0 {
		return nil
	}
	out := make([]string, 0, n)
	for range n {
		out = append(out, r.str())
	}
	return out
}

// decodeCache checks the file's magic and checksum and reads it.
func decodeCache(data []byte) (*cacheData, error) {
	if len(data) < len(cacheMagic)+4 || string(data[:len(cacheMagic)]) != cacheMagic {
		return nil, errCacheCorrupt
	}
	body := data[:len(data)-4]
	if crc32.Checksum(body, cacheCRC) != binary.LittleEndian.Uint32(data[len(body):]) {
		return nil, errCacheCorrupt
	}
	r := &cacheReader{b: body, s: string(body), off: len(cacheMagic)}
	d := &cacheData{Version: int(r.num()), Worktree: r.str(), RootDev: r.num(), RootIno: r.num(), Patterns: r.str()}
	n := r.count()
	d.Dirs = make(map[string]dirRecord, n)
	for range n {
		rel := r.str()
		rec := dirRecord{Dev: r.num(), Ino: r.num(), Mtime: int64(r.num()), Ctime: int64(r.num()), Entries: int(r.num())}
		rec.Guarded, rec.Links, rec.Subdirs = r.strs(), r.strs(), r.strs()
		if m := r.count(); m > 0 {
			rec.Matches = make(map[string]string, m)
			for range m {
				k := r.str()
				rec.Matches[k] = r.str()
			}
		}
		if r.bad {
			return nil, errCacheCorrupt
		}
		d.Dirs[rel] = rec
	}
	if r.bad || r.off != len(body) {
		return nil, errCacheCorrupt
	}
	return d, nil
}
