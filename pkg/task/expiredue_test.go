package task

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// Teardowns sweep for expired prepared cages once per ExpireEvery (a
// tenth of the TTL, at most 5 minutes), by a stamp in the state directory
// that purge counts as shrooms' own; a stamp that is not a plain file
// means a sweep, and is not followed.
func TestExpireDue(t *testing.T) {
	dir := t.TempDir()
	cfg := &config.Config{State: config.State{Dir: dir}, Cage: config.Cage{PreparedTTL: config.Duration(time.Second)}}
	r := New(cfg, nil)
	now := time.Now()
	assert.Assert(t, r.ExpireDue(now), "no stamp yet: sweep")
	assert.Assert(t, !r.ExpireDue(now.Add(50*time.Millisecond)), "within a tenth of the TTL: no sweep")
	assert.Assert(t, r.ExpireDue(now.Add(150*time.Millisecond)), "past a tenth of the TTL: sweep")
	assert.Assert(t, !r.ExpireDue(now.Add(160*time.Millisecond)), "the sweep was marked")

	cfg.Cage.PreparedTTL = config.Duration(time.Hour)
	assert.Equal(t, ExpireEvery(time.Hour), 5*time.Minute)
	assert.Assert(t, !r.ExpireDue(now.Add(4*time.Minute)))
	assert.Assert(t, r.ExpireDue(now.Add(6*time.Minute)), "at most 5 minutes apart")
	assert.Assert(t, r.ExpireDue(now.Add(-time.Minute)), "a stamp from the future is no reason to wait")

	left, err := taskstate.Layout{Dir: dir}.Leftovers(10)
	assert.NilError(t, err)
	assert.Equal(t, len(left), 0, "the stamp is skeleton: %v", left)

	stamp := taskstate.Layout{Dir: dir}.ExpireStamp()
	target := filepath.Join(t.TempDir(), "target")
	assert.NilError(t, os.WriteFile(target, nil, 0o600))
	old := time.Now().Add(-time.Hour)
	assert.NilError(t, os.Chtimes(target, old, old))
	assert.NilError(t, os.Remove(stamp))
	assert.NilError(t, os.Symlink(target, stamp))
	assert.Assert(t, r.ExpireDue(time.Now()), "a symlinked stamp: sweep")
	st, err := os.Stat(target)
	assert.NilError(t, err)
	assert.Assert(t, st.ModTime().Equal(old), "the symlink was followed")
}
