package guard

import (
	"path"
	"strings"
)

// Globs as opencode's instructions use them (worktree-relative, dot files
// matched): `*`, `?` and `[...]` within one path element, `**` for any
// number of elements, `{a,b}` alternatives.

// expandBraces returns the patterns a `{a,b}` pattern stands for (nested
// braces expand in turn; at most 64 patterns, the rest dropped into one
// catch-all `**` so that a hostile pattern cannot blow up and never
// matches less).
func expandBraces(p string) []string {
	out := []string{p}
	for range 8 {
		var next []string
		changed := false
		for _, q := range out {
			open := strings.IndexByte(q, '{')
			if open < 0 {
				next = append(next, q)
				continue
			}
			depth, end := 0, -1
			var commas []int
			for i := open; i < len(q) && end < 0; i++ {
				switch q[i] {
				case '{':
					depth++
				case '}':
					if depth--; depth == 0 {
						end = i
					}
				case ',':
					if depth == 1 {
						commas = append(commas, i)
					}
				}
			}
			if end < 0 {
				next = append(next, q)
				continue
			}
			changed = true
			start := open + 1
			for _, c := range append(commas, end) {
				next = append(next, q[:open]+q[start:c]+q[end+1:])
				start = c + 1
			}
		}
		out = next
		if len(out) > 64 {
			return []string{"**"}
		}
		if !changed {
			break
		}
	}
	return out
}

// globMatch reports whether the worktree-relative path rel matches pattern.
func globMatch(pattern, rel string) bool {
	for _, p := range expandBraces(pattern) {
		if matchSegs(strings.Split(p, "/"), strings.Split(rel, "/")) {
			return true
		}
	}
	return false
}

func matchSegs(pat, name []string) bool {
	if len(pat) == 0 {
		return len(name) == 0
	}
	if pat[0] == "**" {
		for i := 0; i <= len(name); i++ {
			if matchSegs(pat[1:], name[i:]) {
				return true
			}
		}
		return false
	}
	if len(name) == 0 {
		return false
	}
	ok, err := path.Match(pat[0], name[0])
	return err == nil && ok && matchSegs(pat[1:], name[1:])
}

// globBelow reports whether something below the directory dir could match
// pattern (a link there would lead the glob on).
func globBelow(pattern, dir string) bool {
	for _, p := range expandBraces(pattern) {
		if prefixSegs(strings.Split(p, "/"), strings.Split(dir, "/")) {
			return true
		}
	}
	return false
}

func prefixSegs(pat, dir []string) bool {
	if len(dir) == 0 {
		return len(pat) > 0
	}
	if len(pat) == 0 {
		return false
	}
	if pat[0] == "**" {
		return true
	}
	ok, err := path.Match(pat[0], dir[0])
	return err == nil && ok && prefixSegs(pat[1:], dir[1:])
}

// compiledPattern is a Pattern split for matching many paths.
type compiledPattern struct {
	alts [][]string
	by   string
}

func compilePatterns(ps []Pattern) []compiledPattern {
	out := make([]compiledPattern, 0, len(ps))
	for _, p := range ps {
		c := compiledPattern{by: p.By}
		for _, a := range expandBraces(p.Glob) {
			c.alts = append(c.alts, strings.Split(a, "/"))
		}
		out = append(out, c)
	}
	return out
}

func (c compiledPattern) match(segs []string) bool {
	for _, a := range c.alts {
		if matchSegs(a, segs) {
			return true
		}
	}
	return false
}

func (c compiledPattern) below(segs []string) bool {
	for _, a := range c.alts {
		if prefixSegs(a, segs) {
			return true
		}
	}
	return false
}
