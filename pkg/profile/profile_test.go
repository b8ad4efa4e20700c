package profile

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// TestProfileTable: every method of table is a profile named after it,
// names are unique, and a profile with a managed policy or a baseline
// names both of its paths.
func TestProfileTable(t *testing.T) {
	seen := map[string]bool{}
	tt := reflect.TypeOf(table{})
	all := All()
	assert.Equal(t, len(all), tt.NumMethod())
	for i, p := range all {
		assert.Equal(t, strings.ToLower(tt.Method(i).Name), p.Name, "a profile's method is its name")
		assert.Assert(t, !seen[p.Name], "duplicate profile %s", p.Name)
		seen[p.Name] = true
		assert.Equal(t, p.PolicyDir == "", p.PolicyDest == "", p.Name)
		assert.Equal(t, p.PolicyDir == "", p.Policy == nil, p.Name)
		assert.Equal(t, p.Settings == "", p.Instructions == "", p.Name)
		assert.Assert(t, p.BootstrapTargets != nil, p.Name)
		got, ok := Lookup(p.Name)
		assert.Assert(t, ok)
		assert.Equal(t, got.Name, p.Name)
		for _, bt := range p.BootstrapTargets {
			ru := Match(p.Keep, strings.Split(bt, "/"))
			assert.Assert(t, ru != nil && ru.Kind == KindFilter, "%s: bootstrap target %s is a filtered keep-list file", p.Name, bt)
		}
		if p.SignIn != "" {
			assert.Assert(t, p.IsBootstrapTarget(p.SignIn), p.Name)
		}
		for _, ru := range p.Keep {
			switch ru.Kind {
			case KindFilter:
				assert.Assert(t, ru.Filter != nil, "%s %v", p.Name, ru.Pattern)
			case KindLines:
				assert.Assert(t, ru.Lines != nil, "%s %v", p.Name, ru.Pattern)
			case KindDatabase:
				assert.Assert(t, ru.Rebuild != nil && ru.Magic != "", "%s %v", p.Name, ru.Pattern)
			}
		}
		if p.Agent != nil {
			assert.Assert(t, len(p.Agent.Command) > 0 && len(p.Agent.Home) > 0, p.Name)
			assert.Equal(t, p.Agent.Home[0], p.Name)
		}
	}
	_, ok := Lookup("zsh")
	assert.Assert(t, !ok)
}

// TestOverlap: a baseline path may sit beside kept files, never on one,
// above one or below one.
func TestOverlap(t *testing.T) {
	rules, err := KeepList(Names())
	assert.NilError(t, err)
	for rel, want := range map[string]string{
		".claude/settings.json":   "",
		".gitconfig":              "",
		".claude.json":            "overlaps the keep-list",
		".claude/projects":        "overlaps the keep-list",
		".claude.json/x":          "lies under kept file",
		".local/share/opencode/x": "",
	} {
		got := Overlap(rules, rel)
		if want == "" {
			assert.Equal(t, got, "", rel)
		} else {
			assert.Assert(t, strings.Contains(got, want), "%s: %q", rel, got)
		}
	}
	_, err = KeepList([]string{"zsh"})
	assert.ErrorContains(t, err, `unknown HOME profile "zsh"`)
}

// TestMergeRefusesEnforced: an owner key may add to the managed policy,
// never change an enforced key; the same value is fine.
func TestMergeRefusesEnforced(t *testing.T) {
	for _, p := range All() {
		if p.Policy == nil {
			continue
		}
		files, err := p.Policy(map[string]any{"extraKey": true}, Gateway{})
		assert.NilError(t, err, p.Name)
		assert.Assert(t, len(files) > 0, p.Name)
	}
	out, err := Merge(map[string]any{"a": []any{}}, map[string]any{"a": []string{}, "b": 1})
	assert.NilError(t, err)
	assert.Equal(t, out["b"], 1)
	_, err = Merge(map[string]any{"a": false}, map[string]any{"a": true})
	var ee *EnforcedError
	assert.Assert(t, errors.As(err, &ee))
	assert.Equal(t, ee.Key, "a")
}
