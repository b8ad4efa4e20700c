package diff

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"golang.org/x/sys/unix"
)

// The cache file's inode filter: a Bloom filter of the inodes of every
// non-directory its listings name. After a turn the link pass looks for
// the paths of inodes that may have other links (a file changed outside
// the worktree with more than one link, an inode an event named without a
// path); when the filter says none of them is in the file's listings, only
// the directories listed again before the turn are searched, not the
// 100 000 names of an unchanged worktree. A filter never says no to an
// inode it holds; a false yes only costs the full search.

const (
	filterBitsPerInode = 16
	filterHashes       = 4
	minFilterBits      = 64
	maxFilterBits      = 1 << 28
)

// inoFilter is the filter's bits, a power of two of them.
type inoFilter struct {
	words []uint64
	mask  uint64
}

// newInoFilter makes an empty filter sized for n inodes.
func newInoFilter(n int) *inoFilter {
	m := uint64(minFilterBits)
	for m < uint64(n)*filterBitsPerInode && m < maxFilterBits {
		m <<= 1
	}
	return &inoFilter{words: make([]uint64, m/64), mask: m - 1}
}

// probes calls fn with the filter's bit for each of its hashes of ino
// (double hashing over one 64-bit mix), until fn says stop.
func (f *inoFilter) probes(ino uint64, fn func(bit uint64) bool) bool {
	h := ino * 0x9e3779b97f4a7c15
	h ^= h >> 29
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 32
	a, b := h, bits.RotateLeft64(h, 32)|1
	for i := range uint64(filterHashes) {
		if !fn((a + i*b) & f.mask) {
			return false
		}
	}
	return true
}

func (f *inoFilter) add(ino uint64) {
	f.probes(ino, func(bit uint64) bool { f.words[bit>>6] |= 1 << (bit & 63); return true })
}

// has says whether ino may be in the filter (false: it is not).
func (f *inoFilter) has(ino uint64) bool {
	return f.probes(ino, func(bit uint64) bool { return f.words[bit>>6]&(1<<(bit&63)) != 0 })
}

func (f *inoFilter) bytes() []byte {
	b := make([]byte, 0, len(f.words)*8)
	for _, w := range f.words {
		b = binary.LittleEndian.AppendUint64(b, w)
	}
	return b
}

// decodeInoFilter is the filter of the cache file's bytes (nil: not one).
func decodeInoFilter(b []byte) *inoFilter {
	n := len(b) / 8
	if len(b)%8 != 0 || n*64 < minFilterBits || n*64 > maxFilterBits || n&(n-1) != 0 {
		return nil
	}
	f := &inoFilter{words: make([]uint64, n), mask: uint64(n*64) - 1}
	for i := range f.words {
		f.words[i] = binary.LittleEndian.Uint64(b[i*8:])
	}
	return f
}

// inoFilter is the cache file's filter of the inodes of its listings (nil:
// no cache file used, or it failed: Err).
func (ns *Namespace) inoFilter() *inoFilter {
	if ns.src == nil {
		return nil
	}
	b, err := ns.src.read(ns.src.filter)
	if err != nil {
		return nil
	}
	f := decodeInoFilter(b)
	if f == nil {
		ns.src.err = fmt.Errorf("namespace cache: %w (inode filter)", errCorrupt)
	}
	return f
}

// linked is the paths the namespace names of the non-directories whose
// inode is in inos (linksOf), searching only the directories not read
// from the cache file when its filter rules every inode of inos out.
func (ns *Namespace) linked(inos map[uint64]bool) []string {
	set := newInoSet(inos)
	ns.linkPass = "full"
	f := ns.inoFilter()
	if f == nil {
		return ns.linksOf("", set, nil)
	}
	for ino := range inos {
		if f.has(ino) {
			return ns.linksOf("", set, nil)
		}
	}
	ns.linkPass = "filtered"
	var out []string
	for rel, d := range ns.dirs {
		if d.cached {
			continue
		}
		d.each(func(n nsName) bool {
			if n.typ != unix.DT_DIR && set.has(n.ino) {
				out = append(out, join(rel, n.name))
			}
			return true
		})
	}
	return out
}
