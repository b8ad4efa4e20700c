package homereset

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"github.com/shrooms-cage/shrooms/pkg/profile"
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

// keepLines rebuilds a kept JSONL file (fd, already checked for type and
// size) into the stage. A file that cannot be read whole is dropped; lines
// that do not parse are dropped from it and counted. What the last reset
// provably wrote is not parsed again (cctranscache.go).
func (b *builder) keepLines(fd int, st unix.Stat_t, fr *walkFrame, name, rel string, ru *profile.Rule, limit int64) error {
	src, err := openRegular(fd)
	if err != nil {
		b.drop(rel, fmt.Sprintf("cannot be read (%v)", err))
		return nil
	}
	defer src.Close()
	prefix := int64(0)
	ph, proven := b.provenPrefix(src, rel, st.Size)
	if proven && b.s.lines[rel].Size == st.Size {
		return b.keepUnchanged(fd, fr, name, rel, ru, st.Size, ph.Sum(nil))
	}
	if proven {
		prefix = b.s.lines[rel].Size
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		b.drop(rel, fmt.Sprintf("cannot be read (%v)", err))
		return nil
	}
	var drops []profile.RowDrop
	var size int64
	var digest []byte
	rebuild := func(w io.Writer) error {
		h := sha256.New()
		cw := &countWriter{w: io.MultiWriter(w, h)}
		if _, err := io.CopyN(cw, src, prefix); err != nil {
			return err
		}
		var rerr error
		drops, rerr = profile.RebuildLines(b.ctx, src, cw, limit-prefix, ru.Lines())
		size, digest = cw.n, h.Sum(nil)
		return rerr
	}
	if b.dry {
		err = rebuild(io.Discard)
	} else {
		dir, derr := b.stageDir(fr)
		if derr != nil {
			return fmt.Errorf("stage %s: %w", rel, derr)
		}
		err = writeFileFrom(dir, name, ru.Mode, b.s.in.UID, b.s.in.GID, rebuild)
	}
	if err != nil {
		return b.unrebuilt(rel, err, true)
	}
	b.rebuilt(rel, size)
	b.note(rel, size, digest)
	b.droppedRows(rel, drops, "")
	return nil
}

// keepUnchanged carries a JSONL file that is byte for byte what the last
// reset wrote: it is hard-linked like a blob.
func (b *builder) keepUnchanged(fd int, fr *walkFrame, name, rel string, ru *profile.Rule, size int64, digest []byte) error {
	b.carried(rel, size)
	b.note(rel, size, digest)
	if b.dry {
		return nil
	}
	return b.link(fd, fr, name, rel, ru.Mode)
}
