// Package safetext makes names a cage chose safe to show: on a terminal, in
// JSON, in a log. A file name may hold any byte but NUL and '/', so a name
// printed as it is can drive the owner's terminal (C0 and C1 controls: CSI,
// OSC, ST, also as raw invalid-UTF-8 bytes 0x80–0x9F that some terminals
// take for C1) or show the owner another name than the real one (bidi
// overrides and other format characters).
//
// Escape writes every such character as a visible escape and a backslash as
// two, so the escaped text holds none of them and two different inputs never
// escape alike (the mapping is injective: Unescape inverts it):
//
//	\\          a backslash
//	\xHH        a byte below 0x80 (C0 control, DEL) or an invalid UTF-8 byte
//	\uHHHH      a rune up to U+FFFF (C1 control, format character, …)
//	\UHHHHHHHH  a rune above U+FFFF (tag characters, …)
package safetext

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Forbidden reports whether r must not reach output as it is: C0 controls,
// DEL, C1 controls, format characters (Cf: bidi marks, embeddings,
// overrides and isolates, zero-width characters, tags, …), line and
// paragraph separators, and the replacement character, which stands for an
// invalid byte and so is escaped itself.
func Forbidden(r rune) bool {
	return r < 0x20 || (r >= 0x7f && r <= 0x9f) || r == utf8.RuneError ||
		unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// Escape returns s with every forbidden rune, every invalid UTF-8 byte and
// every backslash escaped; other text is kept as it is.
func Escape(s string) string { return escape(s, false) }

// Text is Escape for shrooms' own multi-line text output: newlines and tabs
// are kept, everything else is escaped as by Escape.
func Text(s string) string { return escape(s, true) }

func escape(s string, text bool) string {
	if clean(s, text) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case text && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case !Forbidden(r):
			b.WriteString(s[i : i+n])
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
		i += n
	}
	return b.String()
}

// clean reports whether s needs no escaping (the common case, no allocation).
func clean(s string, text bool) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c == '\\' || c == 0x7f || (c < 0x20 && !(text && (c == '\n' || c == '\t'))) {
				return false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if Forbidden(r) {
			return false
		}
		i += n
	}
	return true
}

// Unescape inverts Escape (and Text); it fails on text Escape never
// produces.
func Unescape(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 >= len(s) {
			return "", fmt.Errorf("unescape: a lone backslash at the end")
		}
		w, ok := escWidth(s[i+1])
		if !ok || i+2+w > len(s) {
			return "", fmt.Errorf("unescape: bad escape at %d", i)
		}
		if w == 0 {
			b.WriteByte('\\')
			i++
			continue
		}
		var v uint64
		if _, err := fmt.Sscanf(s[i+2:i+2+w], "%x", &v); err != nil || len(strings.Trim(s[i+2:i+2+w], "0123456789abcdef")) != 0 {
			return "", fmt.Errorf("unescape: bad escape at %d", i)
		}
		if s[i+1] == 'x' {
			b.WriteByte(byte(v))
		} else {
			b.WriteRune(rune(v))
		}
		i += 1 + w
	}
	return b.String(), nil
}

// escWidth is how many hex digits follow the escape letter c.
func escWidth(c byte) (int, bool) {
	switch c {
	case '\\':
		return 0, true
	case 'x':
		return 2, true
	case 'u':
		return 4, true
	case 'U':
		return 8, true
	}
	return 0, false
}
