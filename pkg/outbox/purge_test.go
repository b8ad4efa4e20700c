package outbox

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

func TestRemoveEmptyKeepsAnOutboxThatHoldsSomething(t *testing.T) {
	for _, tc := range []struct{ plant, want string }{
		{"t1", "t1"},                   // a task's outbox
		{".pending/t1", ".pending/t1"}, // a delivery waiting
		{"stray", "stray"},             // anything else
	} {
		root := filepath.Join(t.TempDir(), "outbox")
		assert.NilError(t, os.MkdirAll(filepath.Join(root, PendingDir), 0o700))
		assert.NilError(t, os.MkdirAll(filepath.Join(root, tc.plant), 0o700))
		left, err := Leftover(root)
		assert.NilError(t, err)
		assert.Equal(t, left, tc.want)
		assert.ErrorContains(t, RemoveEmpty(root), "still holds "+tc.want)
		_, err = os.Stat(filepath.Join(root, tc.plant))
		assert.Check(t, err)
	}
}

func TestRemoveEmptyRemovesTheSkeleton(t *testing.T) {
	parent := t.TempDir()
	root := filepath.Join(parent, "outbox")
	assert.NilError(t, os.MkdirAll(filepath.Join(root, PendingDir), 0o700))
	assert.NilError(t, RemoveEmpty(root))
	_, err := os.Lstat(root)
	assert.Check(t, os.IsNotExist(err), "%v", err)
	assert.NilError(t, RemoveEmpty(root), "a missing root is removed already")
	_, err = os.Stat(parent)
	assert.Check(t, err)
}
