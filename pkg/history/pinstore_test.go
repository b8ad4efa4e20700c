package history

import (
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// loadPin reads session's pin as a new turn's tracker does.
func loadPin(dir, session string) (*Pin, error) {
	return (&pinStore{dir: dir, session: session}).load()
}

// savePin writes p as session's newest pin.
func savePin(dir string, p *Pin) error {
	st := &pinStore{dir: dir, session: p.Session}
	if _, err := st.load(); err != nil {
		return err
	}
	return st.save(p)
}

// pinBytes is what the state directory holds of session's pin.
func pinBytes(t *testing.T, dir, session string) string {
	t.Helper()
	var out string
	for _, f := range []string{slotFile(dir, session, 0), slotFile(dir, session, 1), legacyPinFile(dir, session)} {
		b, err := os.ReadFile(f)
		if !errors.Is(err, os.ErrNotExist) {
			assert.NilError(t, err)
		}
		out += string(b) + "\x00"
	}
	return out
}

// TestTornSlotKeepsThePinBefore: a kill while a slot is written leaves it
// torn (any prefix of the new bytes over the old ones): the other slot's
// pin, the one before, is read; a whole write is read as the newest.
func TestTornSlotKeepsThePinBefore(t *testing.T) {
	dir := t.TempDir()
	turn1(t, dir) // four messages, in two requests and two answers
	p, err := loadPin(dir, "s")
	assert.NilError(t, err)
	assert.Equal(t, len(p.msgs), 4)
	st := &pinStore{dir: dir, session: "s"}
	_, err = st.load()
	assert.NilError(t, err)
	next := slotFile(dir, "s", 1-st.slot)
	old, err := os.ReadFile(next)
	assert.NilError(t, err)

	// The next pin: the history with a new user message.
	tr := NewTracker(dir, Refuse)
	_, err = tr.Check("s", conv("u:hello", "a:a1", "u:more", "a:a2", "u:next"), true)
	assert.NilError(t, err)
	whole, err := os.ReadFile(next)
	assert.NilError(t, err)
	p, err = loadPin(dir, "s")
	assert.NilError(t, err)
	assert.Equal(t, len(p.msgs), 5, "control: the whole write is the pin")

	for _, cut := range []int{0, 1, 8, 12, 20, 30, len(whole) / 2, len(whole) - 1} {
		torn := append([]byte{}, whole[:cut]...)
		if len(old) > cut {
			torn = append(torn, old[cut:]...)
		}
		assert.NilError(t, os.WriteFile(next, torn, 0o600))
		p, err := loadPin(dir, "s")
		assert.NilError(t, err)
		assert.Equal(t, len(p.msgs), 4, "a slot torn at %d was read", cut)
	}
}

// TestLegacyPinRead: a pin of the earlier format (one JSON file) is read,
// and the first write replaces it by the slots.
func TestLegacyPinRead(t *testing.T) {
	dir := t.TempDir()
	msgs := []Message{}
	for _, raw := range []string{`{"role":"user","content":"hello"}`, `{"role":"assistant","content":"a1"}`} {
		m, err := Sum([]byte(raw))
		assert.NilError(t, err)
		msgs = append(msgs, m)
	}
	legacy := Pin{Session: "s", Messages: pinned(msgs), Answered: true, Delivered: true, Chain: chain(msgs)}
	b, err := json.Marshal(legacy)
	assert.NilError(t, err)
	assert.NilError(t, os.MkdirAll(dir, 0o700))
	assert.NilError(t, os.WriteFile(legacyPinFile(dir, "s"), b, 0o600))

	tr := NewTracker(dir, Refuse)
	_, err = tr.Check("s", []byte(`[{"role":"user","content":"hello"},{"role":"assistant","content":"a1"},{"role":"user","content":"next"}]`), true)
	assert.NilError(t, err)
	assert.Equal(t, tr.Reports()[0].Verdict, VerdictContinued)
	_, err = os.Stat(legacyPinFile(dir, "s"))
	assert.Assert(t, errors.Is(err, os.ErrNotExist), "the legacy pin stayed beside the slots")
	_, err = NewTracker(dir, Refuse).Check("s", []byte(`[{"role":"user","content":"hello"},{"role":"assistant","content":"forged"},{"role":"user","content":"next"}]`), true)
	var mm *Mismatch
	assert.Assert(t, errors.As(err, &mm))
	assert.Equal(t, mm.Index, 1)
}

// TestKeptRequest: a closed tracker keeps each session's last request; the
// next turn's first request is compared with its bytes and gets the
// verdicts of a tracker without it (control: the kept file is read); a
// damaged or another session's file is ignored.
func TestKeptRequest(t *testing.T) {
	hist := conv("u:hello", "a:a1", "u:more")
	next := []byte(`[{"role":"user","content":[{"type":"text","text":"hello"}]},{"role":"assistant","content":[{"type":"text","text":"a1"}]},{"role":"user","content":[{"type":"text","text":"more"}]},{"role":"user","content":"next"}]`)
	forged := []byte(`[{"role":"user","content":[{"type":"text","text":"hello"}]},{"role":"assistant","content":[{"type":"text","text":"A1"}]},{"role":"user","content":[{"type":"text","text":"more"}]},{"role":"user","content":"next"}]`)
	setup := func(t *testing.T) string {
		dir := t.TempDir()
		assert.NilError(t, pinRaw(dir, "s", hist))
		tr := NewTracker(dir, Refuse)
		_, err := tr.Check("s", hist, true)
		assert.NilError(t, err)
		assert.NilError(t, tr.Close())
		return dir
	}
	dir := setup(t)
	s := &session{id: "s"}
	loadRaw(dir, s)
	assert.Equal(t, string(s.lastBody), string(hist), "the last request was not kept")
	_, err := NewTracker(dir, Refuse).Check("s", next, true)
	assert.NilError(t, err)
	_, err = NewTracker(setup(t), Refuse).Check("s", forged, true)
	var mm *Mismatch
	assert.Assert(t, errors.As(err, &mm))
	assert.Equal(t, mm.Index, 1)

	// Damaged, or another session's: ignored.
	dir = setup(t)
	b, err := os.ReadFile(rawFile(dir, "s"))
	assert.NilError(t, err)
	b[len(b)-3] ^= 1
	assert.NilError(t, os.WriteFile(rawFile(dir, "s"), b, 0o600))
	s = &session{id: "s"}
	loadRaw(dir, s)
	assert.Assert(t, s.lastBody == nil, "a damaged cache was read")
	dir = setup(t)
	assert.NilError(t, os.Rename(rawFile(dir, "s"), rawFile(dir, "other")))
	s = &session{id: "other"}
	loadRaw(dir, s)
	assert.Assert(t, s.lastBody == nil, "another session's cache was read")
}

// TestPreload: the most recently pinned sessions are read before the
// turn's first request, and a preloaded session gets the verdicts of one
// read on its first request; others are read then, as before.
func TestPreload(t *testing.T) {
	dir := t.TempDir()
	hist := conv("u:hello", "a:a1", "u:more")
	for _, id := range []string{"old", "b", "a"} {
		assert.NilError(t, pinRaw(dir, id, hist))
		time.Sleep(10 * time.Millisecond) // distinct modification times
	}
	tr := NewTracker(dir, Refuse)
	<-tr.Preload()
	tr.mu.Lock()
	_, a := tr.preloaded["a"]
	_, b := tr.preloaded["b"]
	_, old := tr.preloaded["old"]
	tr.mu.Unlock()
	assert.Assert(t, a && b && !old, "preloaded a %v, b %v, old %v", a, b, old)

	forged := []byte(`[{"role":"user","content":"hello"},{"role":"assistant","content":"forged"},{"role":"user","content":"more"}]`)
	_, err := tr.Check("a", forged, true)
	var mm *Mismatch
	assert.Assert(t, errors.As(err, &mm), "a preloaded session accepted a forgery: %v", err)
	assert.Equal(t, mm.Index, 1)
	_, err = tr.Check("b", append(hist[:len(hist)-1:len(hist)-1], []byte(`,{"role":"user","content":"next"}]`)...), true)
	assert.NilError(t, err)
	_, err = tr.Check("old", forged, true)
	assert.Assert(t, errors.As(err, &mm))
	r := tr.Reports()
	assert.Equal(t, len(r), 3)
	assert.Equal(t, r[1].Session, "b")
	assert.Equal(t, r[1].Verdict, VerdictContinued)
}
