package history

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"

	"golang.org/x/sys/unix"
)

// At the end of a turn the tracker keeps, per session, the last request
// it forwarded: its messages' bytes, where each message lies in them, and
// each message's canonical and raw digests (<digest>.raw beside the pin).
// The next turn's first request is then compared with those bytes like a
// request of the same turn (one compare of the history) instead of
// hashing every message to find it in the pin's raw digests. It is a
// cache of facts about bytes (these bytes canonicalise to this digest),
// checked by a CRC-32C against a torn write and read from the session's
// own file only; the check against the pin is unchanged. Without it (a
// killed turn, a damaged file) the raw digests serve as before.
//
// The file, little-endian: magic "SHRAW01\n" | crc32c of the rest u32 |
// length u32 | session length uvarint, session | count u32 | per message:
// start u32, end u32, role length uvarint, role, digest [32], raw digest
// [32] | body length u32, body.
var rawMagic = []byte("SHRAW01\n")

func rawFile(dir, session string) string { return pinBase(dir, session) + ".raw" }

// Close keeps each session's last forwarded request for the next turn
// (see above). The tracker is not used after it.
func (t *Tracker) Close() error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var first error
	for _, id := range t.order {
		s := t.sessions[id]
		if s.lastBody == nil || s.store == nil || s.store.seq == 0 {
			continue
		}
		if err := writeRaw(t.dir, s); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func writeRaw(dir string, s *session) error {
	b := append([]byte{}, rawMagic...)
	b = append(b, make([]byte, 8)...)
	b = binary.AppendUvarint(b, uint64(len(s.id)))
	b = append(b, s.id...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s.lastSpans)))
	for i, sp := range s.lastSpans {
		b = binary.LittleEndian.AppendUint32(b, uint32(sp.start))
		b = binary.LittleEndian.AppendUint32(b, uint32(sp.end))
		b = binary.AppendUvarint(b, uint64(len(s.lastMsgs[i].Role)))
		b = append(b, s.lastMsgs[i].Role...)
		b = append(b, s.lastMsgs[i].Digest[:]...)
		b = append(b, s.lastSums[i][:]...)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s.lastBody)))
	b = append(b, s.lastBody...)
	if len(b) > 1<<31 {
		return nil // too large to keep: the raw digests serve
	}
	binary.LittleEndian.PutUint32(b[12:], uint32(len(b)))
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b[12:], castagnoli))
	f, err := os.OpenFile(rawFile(dir, s.id), os.O_WRONLY|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	if err != nil {
		return fmt.Errorf("history cache: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("history cache of session %s is not a regular file", s.id)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		return fmt.Errorf("history cache: %w", err)
	}
	if err := f.Truncate(int64(len(b))); err != nil {
		return fmt.Errorf("history cache: %w", err)
	}
	return f.Close()
}

// loadRaw sets s's last request from its cache, when one is whole and
// names s; else it leaves s as it is.
func loadRaw(dir string, s *session) {
	b, err := readPinFile(rawFile(dir, s.id))
	if err != nil || len(b) < 16 || !bytes.Equal(b[:8], rawMagic) {
		return
	}
	n := binary.LittleEndian.Uint32(b[12:])
	if n < 16 || uint64(n) > uint64(len(b)) {
		return
	}
	b = b[:n]
	if crc32.Checksum(b[12:], castagnoli) != binary.LittleEndian.Uint32(b[8:]) {
		return
	}
	r := rawReader{b: b[16:]}
	if string(r.bytes(r.uvarint())) != s.id {
		return
	}
	count := r.u32()
	if uint64(count)*(8+1+64) > uint64(len(r.b)) {
		return
	}
	spans := make([]span, count)
	msgs := make([]Message, count)
	sums := make([]Digest, count)
	for i := range spans {
		spans[i] = span{int(r.u32()), int(r.u32())}
		msgs[i].Role = string(r.bytes(r.uvarint()))
		copy(msgs[i].Digest[:], r.bytes(32))
		copy(sums[i][:], r.bytes(32))
	}
	body := r.bytes(uint64(r.u32()))
	if r.bad || len(r.b) != 0 {
		return
	}
	prev := 0
	for i, sp := range spans {
		if sp.start < prev || sp.end <= sp.start || sp.end > len(body) || msgs[i].Role == "" {
			return
		}
		prev = sp.end
	}
	s.lastBody, s.lastSpans, s.lastRaw, s.lastMsgs, s.lastSums = body, spans, elements(body, spans), msgs, sums
}

// rawReader reads the cache's fields; bad is set past its end.
type rawReader struct {
	b   []byte
	bad bool
}

func (r *rawReader) bytes(n uint64) []byte {
	if r.bad || n > uint64(len(r.b)) {
		r.bad = true
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

func (r *rawReader) u32() uint32 {
	b := r.bytes(4)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}

func (r *rawReader) uvarint() uint64 {
	v, k := binary.Uvarint(r.b)
	if k <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[k:]
	return v
}
