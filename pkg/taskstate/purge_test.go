package taskstate

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// skeletonAt makes what shrooms leaves in a state directory once every
// task is forgotten (as make vm-test found it).
func skeletonAt(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{"tasks", "homes", "worktrees", "seccomp", "gitseal", "outbox/.pending"} {
		assert.NilError(t, os.MkdirAll(filepath.Join(dir, d), 0o700))
	}
	for _, f := range []string{"idslots.lock", "starting.lock", "gitseal/gitconfig", "seccomp/shrooms-73cb7e18c6a7.json"} {
		assert.NilError(t, os.WriteFile(filepath.Join(dir, f), nil, 0o600))
	}
}

func TestRemoveSkeletonRemovesOnlyTheSkeleton(t *testing.T) {
	parent := t.TempDir()
	l := Layout{Dir: filepath.Join(parent, "state")}
	skeletonAt(t, l.Dir)
	outbox := filepath.Join(l.Dir, "outbox")

	left, err := l.Leftovers(5, outbox)
	assert.NilError(t, err)
	assert.Check(t, is.Len(left, 0))
	// Without skipping the outbox root, it is a leftover (the outbox
	// package decides about it).
	left, err = l.Leftovers(5)
	assert.NilError(t, err)
	assert.DeepEqual(t, left, []string{"outbox"})

	assert.NilError(t, os.RemoveAll(outbox))
	assert.NilError(t, l.RemoveSkeleton())
	_, err = os.Lstat(l.Dir)
	assert.Check(t, os.IsNotExist(err), "%v", err)
	_, err = os.Stat(parent)
	assert.Check(t, err)

	// A missing state directory has no leftovers and removes cleanly.
	left, err = l.Leftovers(5)
	assert.NilError(t, err)
	assert.Check(t, is.Len(left, 0))
	assert.NilError(t, l.RemoveSkeleton())
}

func TestLeftoversNameWhatIsNotShrooms(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		plant      func(t *testing.T, dir string)
	}{
		{"a task", "tasks/t1", func(t *testing.T, dir string) { assert.NilError(t, os.Mkdir(filepath.Join(dir, "tasks/t1"), 0o700)) }},
		{"a HOME image", "homes/shrooms-home-t1.img", func(t *testing.T, dir string) {
			assert.NilError(t, os.WriteFile(filepath.Join(dir, "homes/shrooms-home-t1.img"), nil, 0o600))
		}},
		{"an owner's file", "notes.txt", func(t *testing.T, dir string) {
			assert.NilError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o600))
		}},
		{"a symlink in place of a lock", "starting.lock", func(t *testing.T, dir string) {
			assert.NilError(t, os.Remove(filepath.Join(dir, "starting.lock")))
			assert.NilError(t, os.Symlink("/etc/passwd", filepath.Join(dir, "starting.lock")))
		}},
		{"a seccomp file not of shrooms' naming", "seccomp/other.json", func(t *testing.T, dir string) {
			assert.NilError(t, os.WriteFile(filepath.Join(dir, "seccomp/other.json"), nil, 0o600))
		}},
		{"a gateway's refreshed sign-in", "gateway/anthropic", func(t *testing.T, dir string) {
			assert.NilError(t, os.MkdirAll(filepath.Join(dir, "gateway/anthropic"), 0o700))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := Layout{Dir: filepath.Join(t.TempDir(), "state")}
			skeletonAt(t, l.Dir)
			tc.plant(t, l.Dir)
			left, err := l.Leftovers(5, filepath.Join(l.Dir, "outbox"))
			assert.NilError(t, err)
			assert.DeepEqual(t, left, []string{tc.want})
			assert.NilError(t, os.RemoveAll(filepath.Join(l.Dir, "outbox")))
			err = l.RemoveSkeleton()
			assert.ErrorContains(t, err, "still holds "+tc.want)
			// Nothing was removed.
			for _, f := range []string{"idslots.lock", "gitseal/gitconfig", "seccomp/shrooms-73cb7e18c6a7.json", tc.want} {
				_, err := os.Lstat(filepath.Join(l.Dir, f))
				assert.Check(t, err, f)
			}
		})
	}
}
