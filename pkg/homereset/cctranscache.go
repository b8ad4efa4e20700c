package homereset

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Rebuilding a JSONL file parses every line (~50 MB/s); hashing it runs at
// ~1.4 GB/s. So each reset records, per rebuilt file, the size and SHA-256
// of what it wrote (in .shrooms/, the keeper's alone and never mounted in a cage), and the
// next reset skips the parse of what it can prove it wrote itself: a file
// whose bytes hash to the record is carried as is (hard-linked), and a file
// that grew and whose first recorded-size bytes hash to it (a transcript
// the last turn appended to) keeps that prefix verbatim and rebuilds only
// the appended lines. The proof is the content digest, not a file's
// metadata, which the cage controls (mtime) or shrooms' own cleanup
// changes (ctime, on unlinking the old tree's link).
const lineCacheName = "lines-cache"

// lineCacheEntry is what a reset wrote for one rebuilt file.
type lineCacheEntry struct {
	Size   int64  `json:"size"`
	Digest string `json:"sha256"`
}

// lineCache maps HOME-relative paths to what the last reset wrote there.
type lineCache map[string]lineCacheEntry

// loadLineCache reads the last reset's record; a missing or unreadable one
// is empty (the cost is a full rebuild, never a carried file).
func loadLineCache(meta *os.File) lineCache {
	c := lineCache{}
	fd, st, err := openNode(meta, lineCacheName)
	if err != nil {
		return c
	}
	defer unix.Close(fd)
	if kuid, _ := keeper(); st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != kuid {
		return c
	}
	data, err := readNode(fd, 64<<20)
	if err != nil || json.Unmarshal(data, &c) != nil {
		return lineCache{}
	}
	return c
}

// saveLineCache records what this reset wrote (then forgets it, so a
// second build in the same reset starts afresh).
func (s *resetter) saveLineCache() error {
	c := s.nextLines
	if c == nil {
		c = lineCache{}
	}
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	s.nextLines = nil
	kuid, kgid := keeper()
	if err := writeFileAt(s.v.meta, lineCacheName, data, 0o600, kuid, kgid); err != nil {
		return errors.Join(errors.New("record the rebuilt transcripts"), err)
	}
	return nil
}

// note records what the stage holds at rel.
func (b *builder) note(rel string, size int64, digest []byte) {
	if b.s.nextLines == nil {
		b.s.nextLines = lineCache{}
	}
	b.s.nextLines[rel] = lineCacheEntry{Size: size, Digest: hex.EncodeToString(digest)}
}

// provenPrefix reports whether the first size bytes of src are what the last
// reset wrote at rel (src is left at offset size when they are). It returns
// the running hash of the prefix.
func (b *builder) provenPrefix(src *os.File, rel string, size int64) (hash.Hash, bool) {
	ent, ok := b.s.lines[rel]
	if !ok || size < ent.Size {
		return nil, false
	}
	h := sha256.New()
	if _, err := io.CopyN(h, src, ent.Size); err != nil {
		return nil, false
	}
	return h, hex.EncodeToString(h.Sum(nil)) == ent.Digest
}
