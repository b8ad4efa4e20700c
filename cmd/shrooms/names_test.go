package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode"
	"unicode/utf8"

	"gotest.tools/v3/assert"
)

// hostile names: CSI, OSC and ST as code points and as raw bytes, RLO,
// isolates, an escape sequence and a backslash.
var hostile = []string{
	"\u009b2J", "\u009d0;pwned\u009c", "raw\x9b\x9d\x9c", "evil\u202etxt.sh", "\u2066iso\u2069\u200f",
	"\x1b]0;title\x07", "a\\b",
}

// assertShowable fails when out holds a C1 code point, a raw byte
// 0x80–0x9F outside a valid multi-byte sequence, a C0 control other than
// newline, DEL or a bidi/format character.
func assertShowable(t *testing.T, out []byte, what string) {
	t.Helper()
	for i := 0; i < len(out); {
		r, n := utf8.DecodeRune(out[i:])
		assert.Assert(t, r != utf8.RuneError || n > 1, "%s: invalid UTF-8 byte %#x at %d in %q", what, out[i], i, out)
		bad := (r < 0x20 && r != '\n') || (r >= 0x7f && r <= 0x9f) || unicode.Is(unicode.Cf, r)
		assert.Assert(t, !bad, "%s: %U at %d in %q", what, r, i, out)
		i += n
	}
}

// TestJSONEscapesNames: every string value and map key of shrooms' JSON is
// escaped; plain text passes as it is.
func TestJSONEscapesNames(t *testing.T) {
	m := map[string]any{"plain": "src/main.go", "masked": hostile, "byPath": map[string]string{}}
	for _, h := range hostile {
		m["byPath"].(map[string]string)[h] = h
	}
	b, err := schemaJSON(m)
	assert.NilError(t, err)
	assertShowable(t, b, "json")
	var back map[string]any
	assert.NilError(t, json.Unmarshal(b, &back))
	assertShowable(t, []byte(back["masked"].([]any)[0].(string)+back["masked"].([]any)[3].(string)), "decoded json")
	assert.Equal(t, back["masked"].([]any)[0], `\u009b2J`)
	assert.Equal(t, back["masked"].([]any)[3], `evil\u202etxt.sh`)
	assert.Equal(t, back["masked"].([]any)[6], `a\\b`)
	assert.Equal(t, back["plain"], "src/main.go")
	_, ok := back["by_path"].(map[string]any)[`\u2066iso\u2069\u200f`]
	assert.Assert(t, ok, "%s", b)
}

// TestTextEscapesNames: text listings and stderr lines escape names.
func TestTextEscapesNames(t *testing.T) {
	var w bytes.Buffer
	for _, h := range hostile {
		textf(&w, "  removed %s\n", h)
		textln(&w, "trusted "+h)
		warn(&w, "masked: "+h+"\nsecond line")
	}
	assertShowable(t, w.Bytes(), "text")
	assert.Assert(t, bytes.Contains(w.Bytes(), []byte(`removed evil\u202etxt.sh`+"\n")), w.String())
	assert.Assert(t, bytes.Contains(w.Bytes(), []byte(`shrooms: masked: raw\x9b\x9d\x9c second line`+"\n")), w.String())
}
