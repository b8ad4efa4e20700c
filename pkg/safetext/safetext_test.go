package safetext

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"gotest.tools/v3/assert"
)

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"src/main.go":                "src/main.go",
		"naïve/日本.txt":               "naïve/日本.txt",
		"a\x1b[31mred":               `a\x1b[31mred`,
		"csi\u009b2J":                `csi\u009b2J`,
		"osc\u009d0;x\u009c":         `osc\u009d0;x\u009c`,
		"raw\x9b\x9d\x9c":            `raw\x9b\x9d\x9c`,
		"evil\u202egpj.exe":          `evil\u202egpj.exe`,
		"iso\u2066x\u2069\u200e":     `iso\u2066x\u2069\u200e`,
		"tag\U000E0041":              `tag\U000e0041`,
		`back\slash`:                 `back\\slash`,
		"del\x7f nl\n tab\t":         `del\x7f nl\x0a tab\x09`,
		"bad\xed\xa0\x80 fffd\ufffd": `bad\xed\xa0\x80 fffd\ufffd`,
	} {
		assert.Equal(t, Escape(in), want, "%q", in)
	}
	assert.Equal(t, Text("line 1\n\tline \u009b2\n"), "line 1\n\tline \\u009b2\n")
}

func TestUnescapeRefusesWhatEscapeNeverWrites(t *testing.T) {
	for _, s := range []string{`\`, `\q`, `\x1`, `\u12`, `\xzz`, `\U0000004`} {
		_, err := Unescape(s)
		assert.Assert(t, err != nil, "%q", s)
	}
}

// FuzzEscape: the escaped string holds no forbidden rune and no invalid
// UTF-8, is unchanged when it needed no escaping, and Unescape gives the
// input back (so Escape is injective); Text keeps only newline and tab.
func FuzzEscape(f *testing.F) {
	for _, s := range []string{"", "a", "\x9b", "\u009b[2J", "\u202e", `\x9b`, `\\`, "\xff\xfe", "\n\t", "\U000E0001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, text := range []bool{false, true} {
			e := escape(s, text)
			if !utf8.ValidString(e) {
				t.Fatalf("escape(%q) = %q is not valid UTF-8", s, e)
			}
			for _, r := range e {
				if Forbidden(r) && !(text && (r == '\n' || r == '\t')) {
					t.Fatalf("escape(%q) = %q holds %U", s, e, r)
				}
				if r >= 0x80 && r <= 0x9f || unicode.Is(unicode.Cf, r) {
					t.Fatalf("escape(%q) = %q holds %U", s, e, r)
				}
			}
			back, err := Unescape(e)
			if err != nil || back != s {
				t.Fatalf("Unescape(escape(%q)) = %q, %v", s, back, err)
			}
			if clean(s, text) != (e == s) && !strings.Contains(s, `\`) {
				t.Fatalf("clean(%q) disagrees with escape", s)
			}
		}
	})
}
