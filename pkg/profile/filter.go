package profile

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"
)

// Kind is how a keep-list entry is validated and carried over. Every kept
// file is parsed and rebuilt from an allowlist except Claude's tool-results
// files (output the model reads back on request; nothing parses them as
// state), which are carried opaque.
type Kind int

const (
	// KindFilter: a small JSON object rebuilt from a key allowlist (Filter).
	KindFilter Kind = iota
	// KindBlob: hard-linked into the new HOME after type, filesystem and
	// size checks.
	KindBlob
	// KindDatabase: an SQLite database (with its -wal folded in), rebuilt
	// by Rebuild (opencode.db: from the pinned schema's table and column
	// allowlist, opencode_db.go).
	KindDatabase
	// KindLines: a JSONL file rebuilt record by record by Lines' filter
	// (Claude Code's transcripts and history, claude_transcript.go).
	KindLines
)

// Rule is one keep-list entry: a HOME-relative pattern whose segments are
// path.Match patterns of one name (e.g. "*.jsonl"), a name holding "{uuid}"
// (a session id: "{uuid}.jsonl"), or a final "**" (any path below). No
// segment below the first two may be named "memory" (Claude's auto memory
// is loaded as instructions).
type Rule struct {
	Pattern []string
	Kind    Kind
	// Filter rebuilds a KindFilter file's JSON object.
	Filter func(map[string]any, *FilterEnv) (map[string]any, []FieldDrop)
	// Lines returns a fresh record filter for a KindLines file.
	Lines func() LineFilter
	// Rebuild rebuilds a KindDatabase file (see rebuildOpencodeDB).
	Rebuild func(ctx context.Context, fd, walFd int, max int64, out io.Writer) ([]RowDrop, error)
	// Update, when set, is Rebuild for a real (not dry-run) reset, given a
	// root-only directory state of its own on the HOME's filesystem, kept
	// from reset to reset and never seen by a cage, where it keeps what it
	// needs to rebuild in place (see updateOpencodeDB).
	Update func(ctx context.Context, fd, walFd int, max int64, state string, out io.Writer) ([]RowDrop, error)
	// Unchanged, when set, reports whether the file is byte for byte what
	// Update last wrote (kept in state): it is then carried as it is.
	Unchanged func(fd, walFd int, state string) bool
	// UpdateInPlace, when set, is Update without the copy: it rewrites the
	// file's own inode (fd) to exactly what Update would write, and
	// reports done; the inode is then carried (linked). Not done and no
	// error: use Update, reporting the drops returned here too (see
	// updateOpencodeDBInPlace).
	UpdateInPlace func(ctx context.Context, fd, walFd int, max int64, state string) ([]RowDrop, bool, error)
	// Magic is the first bytes a kept file must start with ("" for any).
	Magic string
	Mode  uint32
}

// FieldDrop is a key a filter left out, and why.
type FieldDrop struct{ Key, Reason string }

// RowDrop is what a record or row rebuild left out of one file: Item is a
// record type, a field, a table or a column, never a value; Rows counts the
// records or rows concerned.
type RowDrop struct {
	Item, Reason string
	Rows         int64
}

// SchemaError marks a kept file shrooms cannot judge (a database whose
// schema is not the pinned one): the reset fails closed.
type SchemaError struct{ msg string }

func (e *SchemaError) Error() string { return e.msg }

// FilterEnv is what filters know of the owner's configuration and the turn.
type FilterEnv struct {
	// mcpURLs are the MCP server URLs the owner's opencode baseline config
	// names, by server name.
	mcpURLs map[string]string
	// Own are the turn's agent's profiles. A profile whose kept state is
	// carried over for another agent's later turn (not Own) gets no seeds.
	Own []string
	// APIKey is the model API key the cage's environment holds when it is
	// shrooms' gateway placeholder ("" otherwise: never a real key).
	APIKey string
}

// owns reports whether profile name is one of the turn's agent's.
func (e *FilterEnv) owns(name string) bool {
	return e != nil && slices.Contains(e.Own, name)
}

func r(pattern string, k Kind) Rule {
	return Rule{Pattern: strings.Split(pattern, "/"), Kind: k, Mode: 0o600}
}

func rf(pattern string, f func(map[string]any, *FilterEnv) (map[string]any, []FieldDrop)) Rule {
	ru := r(pattern, KindFilter)
	ru.Filter = f
	return ru
}

// KeepList returns the keep-list of all the named profiles, or an error for
// an unknown one.
func KeepList(profiles []string) ([]Rule, error) {
	var rules []Rule
	for _, name := range profiles {
		p, ok := Lookup(name)
		if !ok {
			return nil, fmt.Errorf("unknown HOME profile %q (use %s)", name, strings.Join(Names(), ", "))
		}
		rules = append(rules, p.Keep...)
	}
	return rules, nil
}

// Match returns the rule that keeps a file at path segs, if any.
func Match(rules []Rule, segs []string) *Rule {
	for i := range rules {
		if globMatch(rules[i].Pattern, segs, false) {
			return &rules[i]
		}
	}
	return nil
}

// MayContain reports whether a directory at segs may hold kept files.
func MayContain(rules []Rule, segs []string) bool {
	for i := range rules {
		if globMatch(rules[i].Pattern, segs, true) {
			return true
		}
	}
	return false
}

// Overlap says why a baseline file at HOME path rel cannot be laid down
// beside the keep-list rules ("" when it can): the baseline never replaces
// kept state, and nothing lies under a kept file.
func Overlap(rules []Rule, rel string) string {
	segs := strings.Split(rel, "/")
	if Match(rules, segs) != nil || MayContain(rules, segs) {
		return "overlaps the keep-list; the baseline cannot replace kept state"
	}
	for k := 1; k < len(segs); k++ {
		if Match(rules, segs[:k]) != nil {
			return fmt.Sprintf("lies under kept file %q", strings.Join(segs[:k], "/"))
		}
	}
	return ""
}

// globMatch matches path segs against pattern; with prefix it reports whether
// segs is a proper ancestor of some match.
func globMatch(pattern, segs []string, prefix bool) bool {
	for i, p := range pattern {
		if p == "**" {
			return len(segs) > i || prefix && len(segs) == i
		}
		if i == len(segs) {
			return prefix
		}
		if !segMatch(p, segs[i]) || i >= 2 && segs[i] == "memory" {
			return false
		}
	}
	return !prefix && len(segs) == len(pattern)
}

// segMatch matches one path segment: "{uuid}" stands for a session id.
func segMatch(p, s string) bool {
	if pre, post, ok := strings.Cut(p, "{uuid}"); ok {
		return len(s) == len(pre)+36+len(post) && strings.HasPrefix(s, pre) && strings.HasSuffix(s, post) && isUUID(s[len(pre):len(pre)+36])
	}
	ok, _ := path.Match(p, s)
	return ok
}

// isUUID reports whether s is a lowercase 8-4-4-4-12 hex UUID.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
		}
	}
	return true
}

// field is one allowlisted key of a JSON object: its type ("string",
// "string?" (or null), "number", "strings" (array of strings)) and whether
// the object is invalid without it.
type field struct {
	key, typ string
	required bool
}

// filterFields copies the allowlisted fields of in that have the right type
// and carry no URL. ok is false when a required field was not copied.
func filterFields(in map[string]any, spec []field, prefix string) (map[string]any, []FieldDrop, bool) {
	out := map[string]any{}
	var dropped []FieldDrop
	ok := true
	for _, k := range slices.Sorted(maps.Keys(in)) {
		i := slices.IndexFunc(spec, func(f field) bool { return f.key == k })
		switch {
		case i < 0 && urlKey(k):
			dropped = append(dropped, FieldDrop{prefix + k, "URL-bearing"})
		case i < 0:
			dropped = append(dropped, FieldDrop{prefix + k, "not on the allowlist"})
		case !fieldType(in[k], spec[i].typ):
			dropped = append(dropped, FieldDrop{prefix + k, "not a " + spec[i].typ})
		case looksLikeURL(in[k]):
			dropped = append(dropped, FieldDrop{prefix + k, "URL-bearing"})
		default:
			out[k] = in[k]
		}
	}
	for _, f := range spec {
		if _, kept := out[f.key]; f.required && !kept {
			ok = false
		}
	}
	return out, dropped, ok
}

func fieldType(v any, t string) bool {
	switch t {
	case "string?":
		return v == nil || isType(v, "string")
	case "strings":
		a, ok := v.([]any)
		if !ok {
			return false
		}
		for _, x := range a {
			if _, ok := x.(string); !ok {
				return false
			}
		}
		return true
	}
	return isType(v, t)
}

// urlKey reports whether a key's name says it holds an address.
func urlKey(k string) bool {
	k = strings.ToLower(k)
	return strings.Contains(k, "url") || strings.Contains(k, "endpoint") || strings.Contains(k, "host") || strings.Contains(k, "uri")
}

// looksLikeURL reports whether a value (or an element of it) is an address.
func looksLikeURL(v any) bool {
	switch x := v.(type) {
	case string:
		return strings.Contains(x, "://") || strings.HasPrefix(strings.ToLower(x), "www.")
	case []any:
		return slices.ContainsFunc(x, looksLikeURL)
	}
	return false
}

// badName stands in the report for an entry whose name is not a plain id,
// so that text a turn chose never reaches the report.
const badName = "(an entry whose name is not an id)"

// validName reports whether a provider or server name is a plain id.
func validName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func isScalar(v any) bool {
	switch v.(type) {
	case string, bool, json.Number, float64, nil:
		return true
	}
	return false
}

func isType(v any, t string) bool {
	switch t {
	case "string":
		_, ok := v.(string)
		return ok
	case "bool":
		_, ok := v.(bool)
		return ok
	case "number":
		_, ok := v.(json.Number)
		return ok
	case "object":
		// Objects of state: nested values must not be code-bearing structures
		// we cannot judge, so only one level of scalars is accepted.
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		for _, x := range m {
			if !isScalar(x) {
				return false
			}
		}
		return true
	}
	return false
}
