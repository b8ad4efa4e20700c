package history

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// seedRequests are the "messages" values of real requests (testdata,
// captured through the gateway from Claude Code 2.1.332 and opencode
// 1.18.33 against the scripted model API; testdata/compact: a compaction
// request and the histories before and after it).
func seedRequests(f *testing.F) [][]byte {
	f.Helper()
	files, _ := filepath.Glob(filepath.Join("testdata", "requests", "*.json"))
	compact, _ := filepath.Glob(filepath.Join("testdata", "compact", "*.json"))
	files = append(files, compact...)
	var out [][]byte
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		var req struct {
			Messages json.RawMessage `json:"messages"`
		}
		if json.Unmarshal(b, &req) == nil && len(req.Messages) > 0 {
			out = append(out, req.Messages)
		}
	}
	return out
}

// reference decodes a messages array the plain way (encoding/json) and
// applies the canonical form's two rewrites, for comparison.
func reference(raw []byte) ([]any, bool) {
	var msgs []any
	if json.Unmarshal(raw, &msgs) != nil {
		return nil, false
	}
	for _, m := range msgs {
		if o, ok := m.(map[string]any); ok {
			o["content"] = canonicalContent(o["content"])
		}
	}
	return msgs, true
}

// FuzzPinnedPrefix: a history pinned from a real request, then a mutated
// one checked against it. Whatever the mutation, an accepted history
// holds the pinned messages unchanged (as encoding/json reads them, up to
// the canonical form's rewrites) followed only by user messages.
func FuzzPinnedPrefix(f *testing.F) {
	for _, s := range seedRequests(f) {
		f.Add(s, s)
	}
	f.Add(conv("u:hello", "a:a1"), conv("u:hello", "a:a1", "u:x"))
	f.Add([]byte(`[{"role":"user","content":"\u00e9"}]`), []byte(`[{"role":"user","content":"é"}]`))
	f.Fuzz(func(t *testing.T, pinned, got []byte) {
		if !json.Valid(pinned) || !json.Valid(got) {
			return
		}
		dir := t.TempDir()
		if pinRaw(dir, "s", pinned) != nil {
			return
		}
		if _, err := NewTracker(dir, Refuse).Check("s", got, true); err != nil {
			return
		}
		acceptedAsPinned(t, pinned, got)
	})
}

// acceptedAsPinned fails t unless got, accepted after pinned, holds the
// pinned messages unchanged (as encoding/json reads them, up to the
// canonical form's rewrites) followed only by user messages.
func acceptedAsPinned(t *testing.T, pinned, got []byte) {
	t.Helper()
	want, ok1 := reference(pinned)
	have, ok2 := reference(got)
	if !ok1 || !ok2 {
		t.Fatalf("accepted a history encoding/json cannot read")
	}
	if len(have) < len(want) {
		// Only a compaction request may be shorter: a prefix of the
		// pinned history, the instruction appended to its last message.
		n := len(have)
		if n == 0 || !reflect.DeepEqual(want[:n-1], have[:n-1]) || !compactionOf(want[n-1], have[n-1]) {
			t.Fatalf("accepted a shorter history: %d < %d", len(have), len(want))
		}
		return
	}
	for i := range want {
		if i == len(want)-1 && mergedInto(want[i], have[i]) {
			continue // new content merged into a last user message
		}
		if !reflect.DeepEqual(want[i], have[i]) {
			t.Fatalf("accepted a changed message %d:\n%v\n%v", i, want[i], have[i])
		}
	}
	for i := len(want); i < len(have); i++ {
		if m, _ := have[i].(map[string]any); m["role"] != "user" {
			t.Fatalf("accepted a new message %d that is not the user's", i)
		}
	}
}

// FuzzCachedPrefix: the raw-digest path of a turn's first request. A
// history is pinned with the digests of its raw messages; the next
// request repeats its first k messages byte for byte, puts mutated in
// place of message k and repeats the rest. The verdict is the one of a
// pin without raw digests (every message canonicalised) and of another
// session pinned with the same history in other bytes (its raw digests
// name none of these messages): the digests only spare work, and an
// accepted history is the pinned one.
func FuzzCachedPrefix(f *testing.F) {
	for _, s := range seedRequests(f) {
		f.Add(s, uint(1), []byte(`{"role":"user","content":"forged"}`))
		f.Add(s, uint(0), []byte(`{"role":"user","content":[{"type":"text","text":"x"}]}`))
	}
	f.Add(conv("u:hello", "a:a1", "u:go"), uint(1), []byte(`{"content":[{"text":"a1","type":"text"}],"role":"assistant"}`))
	f.Add(conv("u:hello", "a:a1", "u:go"), uint(1), []byte(`{"role":"assistant","content":"a2"}`))
	f.Add(conv("u:hello", "a:a1", "u:go"), uint(3), []byte(`{"role":"assistant","content":"a2"}`))
	f.Fuzz(func(t *testing.T, pinned []byte, k uint, mutated []byte) {
		elems, err := splitArray(pinned)
		if err != nil || !json.Valid(pinned) || len(elems) == 0 {
			return
		}
		k %= uint(len(elems) + 1)
		got := slices.Clone(elems)
		if k < uint(len(elems)) {
			got[k] = mutated
		} else {
			got = append(got, mutated)
		}
		gotRaw := append(append([]byte("["), bytes.Join(got, []byte(","))...), ']')
		if !json.Valid(gotRaw) {
			return
		}
		// The same history in other bytes: each message canonical.
		other := make([][]byte, len(elems))
		for i, e := range elems {
			if _, other[i], err = Canonical(e); err != nil {
				return
			}
		}
		otherRaw := append(append([]byte("["), bytes.Join(other, []byte(","))...), ']')
		verdict := func(id string, raw []byte, sums bool) string {
			dir := t.TempDir()
			if err := pinRawSums(dir, id, raw, sums); err != nil {
				t.Fatal(err)
			}
			tr := NewTracker(dir, Refuse)
			if _, err := tr.Check(id, gotRaw, true); err != nil {
				return err.Error()
			}
			return "accepted"
		}
		cached, plain, elsewhere := verdict("a", pinned, true), verdict("a", pinned, false), verdict("a", otherRaw, true)
		if cached != plain || cached != elsewhere {
			t.Fatalf("the raw digests changed the verdict: cached %q, canonicalised %q, other bytes %q", cached, plain, elsewhere)
		}
		if cached == "accepted" {
			acceptedAsPinned(t, pinned, gotRaw)
		}
	})
}

// FuzzSplitResume: a request split from where it repeats the last one's
// bytes is split as from scratch, and a tracker that compares it with the
// last request it forwarded gives the verdict of a new turn's tracker that
// canonicalises every message.
func FuzzSplitResume(f *testing.F) {
	for _, s := range seedRequests(f) {
		elems, err := splitArray(s)
		if err != nil || len(elems) < 2 {
			continue
		}
		f.Add(s, append(append([]byte("["), bytes.Join(elems[:len(elems)-1], []byte(","))...), []byte(`,{"role":"user","content":"forged"}]`)...))
		f.Add(s, append(append([]byte("["), bytes.Join(elems, []byte(" , "))...), []byte(`,{"role":"user","content":"next"}]`)...))
	}
	f.Add([]byte(`[1,2,{"a":"b"}]`), []byte(`[1,23,{"a":"b"}]`))
	f.Add([]byte(`[{"role":"user","content":"a"} ,{"role":"user","content":"b"}]`), []byte(`[{"role":"user","content":"a"} ]`))
	f.Fuzz(func(t *testing.T, prev, next []byte) {
		if !json.Valid(prev) || !json.Valid(next) {
			return
		}
		prevSpans, _, err := splitSpans(prev, nil, nil)
		if err != nil {
			return
		}
		want, _, wantErr := splitSpans(next, nil, nil)
		got, _, gotErr := splitSpans(next, prev, prevSpans)
		if (wantErr == nil) != (gotErr == nil) || !slices.Equal(want, got) {
			t.Fatalf("resumed split %v (%v), from scratch %v (%v)", got, gotErr, want, wantErr)
		}
		// warm: prev forwarded earlier in the turn; kept: in the last turn,
		// whose tracker kept it at its end; else every message
		// canonicalised.
		verdict := func(warm, kept bool) string {
			dir := t.TempDir()
			if err := pinRawSums(dir, "s", prev, false); err != nil {
				return "unpinnable"
			}
			tr := NewTracker(dir, Refuse)
			if warm || kept {
				if _, err := tr.Check("s", prev, true); err != nil {
					t.Fatalf("the pinned history itself refused: %v", err)
				}
			}
			if kept {
				if err := tr.Close(); err != nil {
					t.Fatal(err)
				}
				tr = NewTracker(dir, Refuse)
			}
			if _, err := tr.Check("s", next, true); err != nil {
				return err.Error()
			}
			return "accepted"
		}
		if w, k, c := verdict(true, false), verdict(false, true), verdict(false, false); w != c || k != c {
			t.Fatalf("the same turn's compare gave %q, the kept request's %q, a new turn's %q", w, k, c)
		}
	})
}

// FuzzCanonical: the canonical form is a fixed point and never panics.
func FuzzCanonical(f *testing.F) {
	for _, s := range seedRequests(f) {
		elems, err := splitArray(s)
		if err != nil {
			f.Fatal(err)
		}
		for _, e := range elems {
			f.Add(e)
		}
	}
	f.Add([]byte(`{"role":"user","content":"x"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		role, c, err := Canonical(raw)
		if err != nil {
			return
		}
		role2, c2, err := Canonical(c)
		if err != nil || role2 != role || string(c2) != string(c) {
			t.Fatalf("canonical form is not a fixed point: %s -> %s (%v)", c, c2, err)
		}
	})
}

// pinRaw pins a raw history for session as a previous turn would have
// (no answer after it), with the digests of its raw messages.
func pinRaw(dir, id string, raw []byte) error { return pinRawSums(dir, id, raw, true) }

// pinRawSums is pinRaw; without sums, as a pin written before the raw
// digests were kept.
func pinRawSums(dir, id string, raw []byte, sums bool) error {
	elems, err := splitArray(raw)
	if err != nil {
		return err
	}
	msgs := make([]Message, len(elems))
	var rawSums []Digest
	for i, e := range elems {
		if msgs[i], err = Sum(e); err != nil {
			return err
		}
		if sums {
			rawSums = append(rawSums, sha256.Sum256(e))
		}
	}
	s := &session{id: id, ref: msgs, refSums: rawSums}
	if n := len(msgs); n > 0 && msgs[n-1].Role == "user" {
		s.lastUser = blockDigests(elems[n-1])
	}
	return savePin(dir, s.pin())
}

// mergedInto reports whether have is the user message want with content
// blocks appended.
func mergedInto(want, have any) bool {
	w, _ := want.(map[string]any)
	h, _ := have.(map[string]any)
	if w == nil || h == nil || w["role"] != "user" || h["role"] != "user" || len(w) != 2 || len(h) != 2 {
		return false
	}
	wc, _ := w["content"].([]any)
	hc, _ := h["content"].([]any)
	return len(hc) >= len(wc) && reflect.DeepEqual(wc, hc[:len(wc)])
}

// compactionOf reports whether have is the user message want with the
// compaction instruction appended as its last block (or the instruction
// alone).
func compactionOf(want, have any) bool {
	h, _ := have.(map[string]any)
	hc, _ := h["content"].([]any)
	if h == nil || h["role"] != "user" || len(h) != 2 || len(hc) == 0 {
		return false
	}
	last, _ := hc[len(hc)-1].(map[string]any)
	if text, _ := last["text"].(string); last["type"] != "text" || !strings.HasPrefix(text, compactInstruction) {
		return false
	}
	w, _ := want.(map[string]any)
	if w == nil || w["role"] != "user" {
		return false
	}
	return reflect.DeepEqual(w["content"], hc[:len(hc)-1])
}
