package history

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// A session's pin is kept in two slot files, written in turn in place
// (pwrite, no rename, no fsync): each holds a sequence number and a
// CRC-32C over its content, and the valid slot with the higher sequence
// is the pin. Replacing a file by rename costs ext4 a flush of the new
// file's data on every write (auto_da_alloc: ~0.5–1.7 ms here, twice per
// request); a write in place costs ~10 µs.
//
// Durability: a kill -9 at any point leaves the slot being written whole
// or torn (its CRC fails), and the other slot holds the pin before it: the
// pin read back is the last history forwarded in full, as with the
// rename. A power loss or kernel crash may lose the writes not yet
// written back (the kernel's writeback, up to ~30 s): the pin read back
// is then an older one, or none when no slot survives whole, and a
// session resumed from a longer transcript is refused (it holds answers
// the pin does not), which fails closed.
//
// A slot is, little-endian:
//
//	magic "SHPIN02\n" | crc32c of the rest (after this field) u32 |
//	length of the slot u32 | sequence u64 |
//	header length u32 | header (JSON: the Pin without its messages) |
//	message count u32 | per message: role length uvarint, role,
//	canonical digest [32], raw digest [32] (zero: none)
//
// A pin written before the slots (one JSON file, <digest>.json) is read
// when the session has no valid slot.
var slotMagic = []byte("SHPIN02\n")

const slotFixed = 8 + 4 + 4 + 8 // magic, crc, length, sequence

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// pinStore reads and writes one session's pin.
type pinStore struct {
	dir, session string
	// seq is the sequence of the newest valid slot (0: none yet) and slot
	// the slot holding it; the next write goes to the other one.
	seq  uint64
	slot int
	buf  []byte // the last slot written, reused
}

// pinBase is the session's file name stem under dir: the id itself is the
// client's, so the files are named by its digest.
func pinBase(dir, session string) string {
	s := sha256.Sum256([]byte(session))
	return filepath.Join(dir, hex.EncodeToString(s[:16]))
}

func slotFile(dir, session string, slot int) string {
	return pinBase(dir, session) + [2]string{".a.pin", ".b.pin"}[slot]
}

// legacyPinFile is where a pin written before the slots lives.
func legacyPinFile(dir, session string) string { return pinBase(dir, session) + ".json" }

// load reads the session's pin; (nil, nil) when there is none.
func (st *pinStore) load() (*Pin, error) {
	var best *Pin
	for slot := 0; slot < 2; slot++ {
		b, err := readPinFile(slotFile(st.dir, st.session, slot))
		if err != nil {
			return nil, fmt.Errorf("history pin of session %s: %w", st.session, err)
		}
		if b == nil {
			continue
		}
		p, seq, ok := decodeSlot(b)
		if !ok {
			continue // torn by a kill while written: the other slot holds the pin before
		}
		if p.Session != st.session {
			return nil, fmt.Errorf("history pin of session %s names session %q", st.session, p.Session)
		}
		if seq > st.seq {
			best, st.seq, st.slot = p, seq, slot
		}
	}
	if best != nil {
		return best, nil
	}
	b, err := readPinFile(legacyPinFile(st.dir, st.session))
	if err != nil || b == nil {
		if err != nil {
			err = fmt.Errorf("history pin of session %s: %w", st.session, err)
		}
		return nil, err
	}
	var p Pin
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("history pin of session %s: %w", st.session, err)
	}
	if p.Session != st.session {
		return nil, fmt.Errorf("history pin of session %s names session %q", st.session, p.Session)
	}
	return &p, nil
}

// recentSessions returns the ids of the n sessions whose slots under dir
// were written last (read from the slots themselves: a file's name is a
// digest of its session's id).
func recentSessions(dir string, n int) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	type slot struct {
		path string
		mod  int64
	}
	var slots []slot
	for _, e := range ents {
		if !e.Type().IsRegular() || filepath.Ext(e.Name()) != ".pin" {
			continue
		}
		if fi, err := e.Info(); err == nil {
			slots = append(slots, slot{filepath.Join(dir, e.Name()), fi.ModTime().UnixNano()})
		}
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i].mod > slots[j].mod })
	var ids []string
	for _, sl := range slots {
		if len(ids) == n {
			break
		}
		b, err := readPinFile(sl.path)
		if err != nil || b == nil {
			continue
		}
		// The file's name must be its session's: a slot names its session.
		base := strings.TrimSuffix(strings.TrimSuffix(sl.path, ".a.pin"), ".b.pin")
		p, _, ok := decodeSlot(b)
		if !ok || !validSession(p.Session) || pinBase(dir, p.Session) != base || slices.Contains(ids, p.Session) {
			continue
		}
		ids = append(ids, p.Session)
	}
	return ids
}

// readPinFile reads a regular file that is not a link; nil when absent.
func readPinFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", filepath.Base(path))
	}
	// Sized from the start: a kept request is as large as the history.
	b := make([]byte, 0, fi.Size()+1)
	for {
		n, err := f.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return nil, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// save writes p into the slot not holding the newest pin, in place.
func (st *pinStore) save(p *Pin) error {
	if st.seq == 0 {
		if err := os.MkdirAll(st.dir, 0o700); err != nil {
			return fmt.Errorf("history pins: %w", err)
		}
	}
	slot := 1 - st.slot
	if st.seq == 0 {
		slot = 0
	}
	b, err := encodeSlot(st.buf[:0], p, st.seq+1)
	if err != nil {
		return err
	}
	st.buf = b
	f, err := os.OpenFile(slotFile(st.dir, st.session, slot), os.O_WRONLY|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	if err != nil {
		return fmt.Errorf("history pin: %w", err)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		f.Close()
		return fmt.Errorf("history pin: %w", err)
	}
	// A shorter pin (a compaction) leaves the old tail: cut it, though
	// the slot's length already says where it ends.
	if fi, err := f.Stat(); err == nil && fi.Size() > int64(len(b)) {
		if err := f.Truncate(int64(len(b))); err != nil {
			f.Close()
			return fmt.Errorf("history pin: %w", err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("history pin: %w", err)
	}
	if st.seq == 0 {
		// The slots supersede a pin of the earlier format.
		_ = os.Remove(legacyPinFile(st.dir, st.session))
	}
	st.seq, st.slot = st.seq+1, slot
	return nil
}

// pinHeader is the part of a Pin a slot keeps as JSON.
type pinHeader struct {
	Session    string         `json:"session"`
	Answered   bool           `json:"answered"`
	Delivered  bool           `json:"delivered"`
	Chain      string         `json:"chain"`
	LastUser   []string       `json:"last_user,omitempty"`
	Compaction *pinCompaction `json:"compaction,omitempty"`
}

func encodeSlot(b []byte, p *Pin, seq uint64) ([]byte, error) {
	hdr, err := json.Marshal(pinHeader{Session: p.Session, Answered: p.Answered, Delivered: p.Delivered, Chain: p.Chain, LastUser: p.LastUser, Compaction: p.Compaction})
	if err != nil {
		return nil, err
	}
	b = append(b, slotMagic...)
	b = append(b, make([]byte, 8)...) // crc and length, set below
	b = binary.LittleEndian.AppendUint64(b, seq)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(hdr)))
	b = append(b, hdr...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(p.msgs)))
	for i, m := range p.msgs {
		b = binary.AppendUvarint(b, uint64(len(m.Role)))
		b = append(b, m.Role...)
		b = append(b, m.Digest[:]...)
		var raw Digest
		if i < len(p.sums) {
			raw = p.sums[i]
		}
		b = append(b, raw[:]...)
	}
	if len(b) > 1<<31 {
		return nil, errors.New("history pin: too large")
	}
	binary.LittleEndian.PutUint32(b[12:], uint32(len(b)))
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b[12:], castagnoli))
	return b, nil
}

// decodeSlot returns a slot's pin and sequence; ok is false for a slot
// that is torn, of another format or malformed.
func decodeSlot(b []byte) (p *Pin, seq uint64, ok bool) {
	if len(b) < slotFixed+4 || !bytes.Equal(b[:8], slotMagic) {
		return nil, 0, false
	}
	n := binary.LittleEndian.Uint32(b[12:])
	if n < slotFixed+4 || uint64(n) > uint64(len(b)) {
		return nil, 0, false
	}
	b = b[:n]
	if crc32.Checksum(b[12:], castagnoli) != binary.LittleEndian.Uint32(b[8:]) {
		return nil, 0, false
	}
	seq = binary.LittleEndian.Uint64(b[16:])
	rest := b[slotFixed:]
	h := binary.LittleEndian.Uint32(rest)
	rest = rest[4:]
	if uint64(h)+4 > uint64(len(rest)) {
		return nil, 0, false
	}
	var hdr pinHeader
	if json.Unmarshal(rest[:h], &hdr) != nil {
		return nil, 0, false
	}
	rest = rest[h:]
	count := binary.LittleEndian.Uint32(rest)
	rest = rest[4:]
	if uint64(count)*(1+2*sha256.Size) > uint64(len(rest)) {
		return nil, 0, false
	}
	p = &Pin{Session: hdr.Session, Answered: hdr.Answered, Delivered: hdr.Delivered, Chain: hdr.Chain, LastUser: hdr.LastUser, Compaction: hdr.Compaction}
	p.msgs = make([]Message, count)
	p.sums = make([]Digest, count)
	for i := range p.msgs {
		l, k := binary.Uvarint(rest)
		if k <= 0 || l == 0 || l > uint64(len(rest)-k) || uint64(len(rest)-k)-l < 2*sha256.Size {
			return nil, 0, false
		}
		rest = rest[k:]
		p.msgs[i].Role = string(rest[:l])
		rest = rest[l:]
		copy(p.msgs[i].Digest[:], rest)
		copy(p.sums[i][:], rest[sha256.Size:])
		rest = rest[2*sha256.Size:]
	}
	if len(rest) != 0 {
		return nil, 0, false
	}
	p.binary = true
	return p, seq, true
}
