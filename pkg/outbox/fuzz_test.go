package outbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// FuzzCheckName: a name checkName accepts is one safe path component, and
// the printable form of any name has no raw control character.
func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"report.md", "..", "a/b", "-rf", "\u202egpj.exe", "ok\x00", "\xff", "日本語.txt", "a..b"} {
		f.Add(s, uint8(255))
	}
	f.Fuzz(func(t *testing.T, name string, maxLen uint8) {
		why := checkName(name, int(maxLen))
		shown := displayName(name)
		for _, r := range shown {
			assert.Assert(t, !unicode.IsControl(r), "displayName kept a control character: %q", shown)
		}
		if why != "" {
			assert.Assert(t, !strings.ContainsAny(why, "\n\r"), "reason is not one line: %q", why)
			return
		}
		assert.Assert(t, utf8.ValidString(name) && len(name) <= int(maxLen), "%q", name)
		assert.Assert(t, !strings.Contains(name, "/") && !strings.Contains(name, "..") && !strings.HasPrefix(name, "-"), "%q", name)
		assert.Assert(t, filepath.Base(name) == name || name == "", "%q is not one component", name)
		for _, r := range name {
			assert.Assert(t, !unicode.IsControl(r) && !unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp), "%q", name)
		}
	})
}

// FuzzPaths: a task id that reaches the host is a valid one, and a
// delivery directory checkDelivery accepts is absolute, clean and outside
// both the outbox root and the worktree, however it is spelled (symbolic
// links included).
func FuzzPaths(f *testing.F) {
	for _, s := range []struct{ task, to string }{
		{"t1", "deliver"}, {"../t1", "root/x"}, {"t1/..", "wt/../root/y"}, {".", "link/z"}, {"T1", "./wt"},
		{"a-b.c_d", "root"}, {"t1\x00", "wtlink/../root"}, {"", "x/../../etc"},
	} {
		f.Add(s.task, s.to)
	}
	base := f.TempDir()
	root, wt := filepath.Join(base, "root"), filepath.Join(base, "wt")
	for _, d := range []string{root, wt, filepath.Join(root, "t1")} {
		assert.NilError(f, os.MkdirAll(d, 0o755))
	}
	assert.NilError(f, os.Symlink(root, filepath.Join(base, "link")))
	assert.NilError(f, os.Symlink(wt, filepath.Join(base, "wtlink")))
	f.Fuzz(func(t *testing.T, task, to string) {
		id, perr := taskid.Parse(task)
		if perr != nil {
			assert.Assert(t, !strings.Contains(perr.Error(), "\n"), "%q", perr)
		}
		rep, err := List(context.Background(), root, id, DefaultLimits())
		if err == nil {
			assert.Assert(t, perr == nil, "List accepted task %q", task)
			assert.Assert(t, rep != nil && rep.Task == task)
		} else {
			assert.Assert(t, !strings.Contains(err.Error(), "\n"), "%q", err)
		}
		real, err := checkDelivery(Request{Root: root, Worktree: wt, To: filepath.Join(base, to)})
		if err != nil {
			assert.Assert(t, !strings.Contains(err.Error(), "\n"), "%q", err)
			return
		}
		assert.Assert(t, filepath.IsAbs(real) && filepath.Clean(real) == real, "%q", real)
		resolved := real
		if r, err := filepath.EvalSymlinks(real); err == nil {
			resolved = r
		}
		for _, in := range []string{root, wt} {
			assert.Assert(t, !within(resolved, in) && !within(real, in), "delivery %q (%s) is inside %s", to, resolved, in)
		}
	})
}
