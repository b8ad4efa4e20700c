package nixcheck

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// nixfmt is not packaged for Debian 12 or published on the registries this
// project reaches, so `nix flake check`'s formatting check cannot run here.
// formatProblems checks the parts of nixfmt's output style (RFC 166) that a
// line-based lint can: no tab, no trailing blank, a final newline, code
// indented by multiples of two spaces, and no line over nixfmt's width of
// 100 columns unless nixfmt could not break it either: a line that is only
// string text (inside an indented string), or `name = "…";` / `"…"` whose
// interpolations are plain names (nixfmt breaks inside `${f x y}` and
// between a function and its arguments).
const nixfmtWidth = 100

var (
	longStringLineRe = regexp.MustCompile(`^(?:(?:[A-Za-z_][\w'-]*|"")(?:\.(?:[A-Za-z_][\w'-]*|""))*\s*=\s*)?"(?:\$\{(?:toString )?[A-Za-z_][\w'.-]*\})*"\s*[;,]?$`)
	stringBodyLineRe = regexp.MustCompile(`^(?:\$\{(?:toString )?[A-Za-z_][\w'.-]*\})*$`)
)

func formatProblems(src string) []string {
	var problems []string
	if src != "" && !strings.HasSuffix(src, "\n") {
		problems = append(problems, "no newline at the end of the file")
	}
	lines := strings.Split(strings.TrimSuffix(src, "\n"), "\n")
	code := strings.Split(strings.TrimSuffix(nixCode(src), "\n"), "\n")
	for i, line := range lines {
		n := i + 1
		if strings.Contains(line, "\t") {
			problems = append(problems, fmt.Sprintf("%d: tab", n))
		}
		if strings.TrimRight(line, " ") != line {
			problems = append(problems, fmt.Sprintf("%d: trailing blank", n))
		}
		c := ""
		if i < len(code) {
			c = code[i]
		}
		// Indentation counts where the line starts with code, not string text.
		if trimmed := strings.TrimLeft(line, " "); strings.TrimSpace(c) != "" && strings.HasPrefix(strings.TrimLeft(c, " "), trimmed[:min(1, len(trimmed))]) {
			if indent := len(line) - len(trimmed); indent%2 != 0 {
				problems = append(problems, fmt.Sprintf("%d: indented by %d spaces (nixfmt indents by 2)", n, indent))
			}
		}
		if len([]rune(line)) > nixfmtWidth {
			t := strings.TrimSpace(c)
			if !stringBodyLineRe.MatchString(t) && !longStringLineRe.MatchString(t) {
				problems = append(problems, fmt.Sprintf("%d: %d columns of code (nixfmt keeps %d): %.60s…", n, len([]rune(line)), nixfmtWidth, strings.TrimSpace(line)))
			}
		}
	}
	return problems
}

func TestNixFormat(t *testing.T) {
	requireNixSources(t)
	for _, f := range nixFiles(t) {
		b, err := os.ReadFile(f)
		assert.NilError(t, err)
		for _, p := range formatProblems(string(b)) {
			t.Errorf("%s:%s", strings.TrimPrefix(f, repo+"/"), p)
		}
	}
}

func TestFormatProblems(t *testing.T) {
	long := strings.Repeat("x", 90)
	src := "{\n" +
		"  a = \"" + long + "\";\n" + // a long plain string: nixfmt keeps it
		"  b = \"" + long + " ${cfg.x} ${toString cfg.y}\";\n" +
		"  c = \"" + long + " ${lib.concatStringsSep \", \" xs}\";\n" + // breakable interpolation
		"  d = lib.filterAttrs (_: p: !(lib.hasPrefix \"/\" p) || isStorePath p) cfg.settings.tokens.xyz.abcdefgh;\n" +
		"  e = mkEnableOption \"" + long + "\";\n" +
		"  f = ''\n    " + long + long + " ${x}\n  '';\n" +
		"   g = 1;\n" +
		"  h = 2; \n" +
		"\ti = 3;\n" +
		"}"
	var got []string
	for _, p := range formatProblems(src) {
		got = append(got, strings.SplitN(p, " (nixfmt keeps", 2)[0])
	}
	assert.Check(t, is.DeepEqual(got, []string{
		"no newline at the end of the file",
		"4: 131 columns of code",
		"5: 103 columns of code",
		"6: 114 columns of code",
		"10: indented by 3 spaces (nixfmt indents by 2)",
		"11: trailing blank",
		"12: tab",
	}))
}
