package nixcheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// nixCode returns src with the contents of string literals blanked (their
// ${…} interpolations kept, as code) and comments removed, so path literals
// can be found in code only. Line structure is kept.
func nixCode(src string) string {
	var b strings.Builder
	// Each stack entry is what the enclosing context is: 'c' code (an
	// interpolation: depth counts its braces), '"' or '\'' a string.
	type frame struct {
		kind  byte
		depth int
	}
	stack := []frame{{kind: 'c'}}
	for i := 0; i < len(src); i++ {
		c := src[i]
		top := &stack[len(stack)-1]
		if c == '\n' {
			b.WriteByte('\n')
			continue
		}
		switch top.kind {
		case 'c':
			switch {
			case c == '#':
				for i+1 < len(src) && src[i+1] != '\n' {
					i++
				}
			case c == '/' && i+1 < len(src) && src[i+1] == '*':
				end := strings.Index(src[i+2:], "*/")
				if end < 0 {
					return b.String()
				}
				b.WriteString(strings.Repeat("\n", strings.Count(src[i:i+2+end+2], "\n")))
				i += 2 + end + 1
			case c == '"':
				b.WriteByte('"')
				stack = append(stack, frame{kind: '"'})
			case c == '\'' && i+1 < len(src) && src[i+1] == '\'':
				b.WriteString("''")
				i++
				stack = append(stack, frame{kind: '\''})
			case c == '{':
				top.depth++
				b.WriteByte(c)
			case c == '}':
				if top.depth == 0 && len(stack) > 1 {
					b.WriteByte('}')
					stack = stack[:len(stack)-1]
					continue
				}
				top.depth--
				b.WriteByte(c)
			default:
				b.WriteByte(c)
			}
		case '"':
			switch {
			case c == '\\':
				i++
			case c == '"':
				b.WriteByte('"')
				stack = stack[:len(stack)-1]
			case c == '$' && i+1 < len(src) && src[i+1] == '{':
				b.WriteString("${")
				i++
				stack = append(stack, frame{kind: 'c'})
			}
		case '\'':
			switch {
			case strings.HasPrefix(src[i:], "'''"), strings.HasPrefix(src[i:], "''$"), strings.HasPrefix(src[i:], "''\\"):
				i += 2
			case strings.HasPrefix(src[i:], "''"):
				b.WriteString("''")
				i++
				stack = stack[:len(stack)-1]
			case c == '$' && i+1 < len(src) && src[i+1] == '{':
				b.WriteString("${")
				i++
				stack = append(stack, frame{kind: 'c'})
			}
		}
	}
	return b.String()
}

var (
	pathLiteralRe = regexp.MustCompile(`(?:^|[\s(\[{=:;])(\.\.?/[A-Za-z0-9._+\-/]*)`)
	// What may stand before a path literal so that the file reaches the
	// store (or is read at evaluation time): an import, readFile, a
	// path-typed option such as environment.etc.<n>.source, or an
	// interpolation.
	pathContextRe = regexp.MustCompile(`(?:\bimport|\bimportApply|\breadFile|\bcallPackage|\bsource\s*=|\$\{)\s*\(?\s*$`)
	importsListRe = regexp.MustCompile(`\bimports\s*=\s*\[[^\]]*$`)
)

// pathUse is one path literal in Nix code and whether its context puts the
// file in the store.
type pathUse struct {
	Line int
	Path string
	OK   bool
}

func pathUses(src string) []pathUse {
	code := nixCode(src)
	var uses []pathUse
	for _, m := range pathLiteralRe.FindAllStringSubmatchIndex(code, -1) {
		start := m[2]
		before := code[:start]
		ok := pathContextRe.MatchString(before) || importsListRe.MatchString(before)
		uses = append(uses, pathUse{Line: strings.Count(before, "\n") + 1, Path: code[start:m[3]], OK: ok})
	}
	return uses
}

// TestVMTestFilesReachClosure: every file nix/tests/*.nix names by a path
// literal is used where Nix copies it to the store or reads it at
// evaluation (import, readFile, a path-typed option, "${./file}"), never as
// a bare path handed to a string function such as lib.escapeShellArgs (which
// yields its source location, absent from the VM); and every non-Nix file
// in nix/tests/ is used that way somewhere.
func TestVMTestFilesReachClosure(t *testing.T) {
	requireNixSources(t)
	dir := filepath.Join(repo, "nix", "tests")
	entries, err := os.ReadDir(dir)
	assert.NilError(t, err)
	used := map[string]bool{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".nix") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		assert.NilError(t, err)
		for _, u := range pathUses(string(b)) {
			assert.Check(t, u.OK, "nix/tests/%s:%d: %s is not imported, read or interpolated (\"${%s}\"): it would not reach the VM", e.Name(), u.Line, u.Path, u.Path)
			if u.OK {
				used[filepath.Clean(filepath.Join("nix/tests", u.Path))] = true
			}
		}
	}
	for _, e := range entries {
		if e.IsDir() || strings.HasSuffix(e.Name(), ".nix") {
			continue
		}
		f := filepath.Join("nix/tests", e.Name())
		assert.Check(t, used[f], "%s is in nix/tests but no test puts it in the store", f)
	}
	assert.Check(t, used["nix/tests/canary.py"])
	assert.Check(t, used["nix/tests/topology.json"])
}

func TestPathUses(t *testing.T) {
	// The bug this guards against (nix/tests/common.nix before the fix) and
	// the fix, plus the contexts that are fine.
	src := `{ lib, pkgs, ... }:
let
  t = builtins.fromJSON (builtins.readFile ./topology.json); # ./in-comment.py
  common = import ./common.nix { };
in
{
  imports = [
    ./a.nix
    (import ../b.nix)
  ];
  bad = lib.escapeShellArgs [
    (lib.getExe pkgs.python3)
    ./canary.py
  ];
  good = lib.escapeShellArgs [ "${./canary.py}" "--x" "./not-a-path" ];
  environment.etc."x".source = ./topology.json;
  script = ''
    python3 ./in-a-string.py ${toString ./stringly.py}
  '';
}
`
	var got []string
	for _, u := range pathUses(src) {
		got = append(got, fmt.Sprintf("%d %s %v", u.Line, u.Path, u.OK))
	}
	assert.Check(t, is.DeepEqual(got, []string{
		"3 ./topology.json true",
		"4 ./common.nix true",
		"8 ./a.nix true",
		"9 ../b.nix true",
		"13 ./canary.py false",
		"15 ./canary.py true",
		"16 ./topology.json true",
		"18 ./stringly.py false",
	}))
}
