// Package history pins a provider session's conversation as the model saw
// it (invariant 10: the conversation is kept state too). The per-turn model
// gateway hands it every Messages request and every answer it forwards; it
// keeps, per task and provider session, a chain of digests over the
// canonical form of each message, on the host (the task's state directory,
// never mounted in a cage). A later turn that resumes the session must send
// exactly that history first, then only new content: a transcript a
// poisoned turn rewrote (a forged user message, a changed tool result, an
// injected reminder, a deleted refusal) no longer matches, and the request
// is refused before the provider reads it.
//
// The canonical form ignores only what the pinned clients rewrite between
// requests of one honest conversation (measured on Claude Code 2.1.332 and
// opencode 1.18.33 through the gateway, see canonical_test.go): where
// cache_control marks sit, a string content versus one text block, JSON
// whitespace and key order.
package history

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Digest is the SHA-256 of one message's canonical form.
type Digest [sha256.Size]byte

// Message is one message of a history as the pin keeps it.
type Message struct {
	Role   string
	Digest Digest
}

// Canonical returns the role of a Messages API message and its canonical
// JSON: keys sorted, no whitespace, numbers in their shortest form, a
// string content as one text block, cache_control marks left out. It
// refuses what could make two different messages look alike: invalid
// UTF-8, a lone surrogate escape, a key given twice, anything but an
// object with a string role.
func Canonical(raw []byte) (string, []byte, error) {
	if !utf8.Valid(raw) {
		return "", nil, errors.New("message is not valid UTF-8")
	}
	if err := checkSurrogates(raw); err != nil {
		return "", nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeStrict(dec)
	if err != nil {
		return "", nil, err
	}
	if _, err := dec.Token(); err == nil {
		return "", nil, errors.New("message: trailing data")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return "", nil, errors.New("message is not a JSON object")
	}
	role, ok := m["role"].(string)
	if !ok {
		return "", nil, errors.New("message has no string role")
	}
	m["content"] = canonicalContent(m["content"])
	var b bytes.Buffer
	b.Grow(len(raw))
	if err := encode(&b, m); err != nil {
		return "", nil, err
	}
	return role, b.Bytes(), nil
}

// Sum returns a message's role and the digest of its canonical form.
func Sum(raw []byte) (Message, error) {
	role, c, err := Canonical(raw)
	if err != nil {
		return Message{}, err
	}
	return Message{Role: role, Digest: sha256.Sum256(c)}, nil
}

// canonical is one message's canonical form, made at most once in a
// request however many checks read it (the last message: its digest,
// the compaction instruction, its blocks).
type canonical struct {
	raw   []byte
	index int  // the message's index in its request
	lazy  bool // not made yet
	role  string
	c     []byte
	err   error
}

// canonicalOf makes raw's canonical form; raw is message i.
func canonicalOf(raw []byte, i int) canonical {
	role, c, err := Canonical(raw)
	return canonical{raw: raw, index: i, role: role, c: c, err: err}
}

func (k *canonical) form() (string, []byte, error) {
	if k.raw == nil {
		return "", nil, errors.New("no message")
	}
	if k.lazy {
		k.role, k.c, k.err = Canonical(k.raw)
		k.lazy = false
	}
	return k.role, k.c, k.err
}

func (k *canonical) sum() (Message, error) {
	role, c, err := k.form()
	if err != nil {
		return Message{}, err
	}
	return Message{Role: role, Digest: sha256.Sum256(c)}, nil
}

// blocks returns the digests of the message's canonical content blocks
// (nil when it has none readable).
func (k *canonical) blocks() []Digest {
	_, c, err := k.form()
	if err != nil {
		return nil
	}
	b, err := contentBlocks(c)
	if err != nil {
		return nil
	}
	return b
}

// blocksAt is blocks of message i of elems.
func (k *canonical) blocksAt(elems [][]byte, i int) []Digest {
	if k.raw != nil && i == k.index {
		return k.blocks()
	}
	return blockDigests(elems[i])
}

// canonicalContent makes a content value (a message's, or a tool result's)
// a list of blocks: a string is one text block; cache_control is dropped
// from every block (clients move the cache breakpoint every request).
func canonicalContent(c any) any {
	switch c := c.(type) {
	case string:
		return []any{map[string]any{"type": "text", "text": c}}
	case []any:
		out := make([]any, 0, len(c))
		for _, b := range c {
			blk, ok := b.(map[string]any)
			if !ok {
				out = append(out, b)
				continue
			}
			delete(blk, "cache_control")
			if blk["type"] == "tool_result" {
				if _, has := blk["content"]; has {
					blk["content"] = canonicalContent(blk["content"])
				}
			}
			out = append(out, blk)
		}
		return out
	}
	return c
}

// decodeStrict decodes one JSON value, refusing a key given twice.
func decodeStrict(dec *json.Decoder) (any, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("message is not JSON: %w", err)
	}
	switch t := t.(type) {
	case json.Delim:
		switch t {
		case '{':
			m := map[string]any{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, fmt.Errorf("message is not JSON: %w", err)
				}
				key := k.(string)
				if _, dup := m[key]; dup {
					return nil, fmt.Errorf("message has key %q twice", key)
				}
				v, err := decodeStrict(dec)
				if err != nil {
					return nil, err
				}
				m[key] = v
			}
			if _, err := dec.Token(); err != nil {
				return nil, fmt.Errorf("message is not JSON: %w", err)
			}
			return m, nil
		case '[':
			a := []any{}
			for dec.More() {
				v, err := decodeStrict(dec)
				if err != nil {
					return nil, err
				}
				a = append(a, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, fmt.Errorf("message is not JSON: %w", err)
			}
			return a, nil
		}
		return nil, errors.New("message is not JSON")
	}
	return t, nil
}

// encode writes v canonically: objects with sorted keys, no whitespace,
// strings as encoding/json writes them, numbers in shortest form.
func encode(b *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case string:
		s, _ := json.Marshal(v)
		b.Write(s)
	case json.Number:
		n, err := canonicalNumber(v)
		if err != nil {
			return err
		}
		b.WriteString(n)
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := encode(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			s, _ := json.Marshal(k)
			b.Write(s)
			b.WriteByte(':')
			if err := encode(b, v[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("message: unexpected %T", v)
	}
	return nil
}

// canonicalNumber writes an integer as itself and any other number in
// strconv's shortest form, so 1.0, 1e0 and 1 are one number (as every JSON
// parser on the way reads them); a number beyond float64 is kept verbatim.
func canonicalNumber(n json.Number) (string, error) {
	if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		return strconv.FormatInt(i, 10), nil
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || math.IsInf(f, 0) {
		return string(n), nil
	}
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return strconv.FormatInt(int64(f), 10), nil
	}
	return strconv.FormatFloat(f, 'g', -1, 64), nil
}

// checkSurrogates refuses a \u escape of a surrogate that is not one half
// of a pair: encoding/json decodes it to U+FFFD, which would make it equal
// to a real U+FFFD.
func checkSurrogates(raw []byte) error {
	for i := 0; ; {
		j := bytes.IndexByte(raw[i:], '\\')
		if j < 0 {
			return nil
		}
		i += j
		if i+1 >= len(raw) {
			return nil
		}
		if raw[i+1] != 'u' {
			i += 2
			continue
		}
		if i+6 > len(raw) {
			return errors.New("message: truncated \\u escape")
		}
		r, ok := hex4(raw[i+2 : i+6])
		if !ok {
			return errors.New("message: bad \\u escape")
		}
		switch {
		case r >= 0xd800 && r < 0xdc00:
			if i+12 > len(raw) || raw[i+6] != '\\' || raw[i+7] != 'u' {
				return errors.New("message: lone surrogate escape")
			}
			lo, ok := hex4(raw[i+8 : i+12])
			if !ok || lo < 0xdc00 || lo >= 0xe000 {
				return errors.New("message: lone surrogate escape")
			}
			i += 12
		case r >= 0xdc00 && r < 0xe000:
			return errors.New("message: lone surrogate escape")
		default:
			i += 6
		}
	}
}

func hex4(b []byte) (rune, bool) {
	var r rune
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// contentBlocks returns the digest of each content block of a canonical
// message.
func contentBlocks(canonical []byte) ([]Digest, error) {
	var m struct {
		Content []json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(canonical, &m); err != nil {
		return nil, err
	}
	out := make([]Digest, len(m.Content))
	for i, b := range m.Content {
		out[i] = sha256.Sum256(b)
	}
	return out, nil
}

// PrefixStats compares a request's messages with the next request's, as a
// client rewrites them: of the earlier request's messages, how many the
// next one repeats byte for byte, and how many canonically (the pin's
// measure). For tests and measurements.
func PrefixStats(prev, next []byte) (total, byteIdentical, canonicalEqual int, err error) {
	a, err := splitArray(prev)
	if err != nil {
		return 0, 0, 0, err
	}
	b, err := splitArray(next)
	if err != nil {
		return 0, 0, 0, err
	}
	for i := range a {
		if i >= len(b) {
			break
		}
		total++
		if bytes.Equal(a[i], b[i]) {
			byteIdentical++
		}
		x, err1 := Sum(a[i])
		y, err2 := Sum(b[i])
		if err1 == nil && err2 == nil && x == y {
			canonicalEqual++
		}
	}
	return total, byteIdentical, canonicalEqual, nil
}
