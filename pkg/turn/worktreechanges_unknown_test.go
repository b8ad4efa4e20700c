package turn

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/worktree/diff"
	"github.com/shrooms-cage/shrooms/pkg/worktree/guard"
)

// When a listing of the namespace cache cannot be read after the turn
// (here: the snapshot closed first, as a failed read or checksum does),
// the turn's report says the changes are unknown instead of counting from
// a namespace with holes; the control, the same scan with its listings
// readable, reports the (no) changes.
func TestWorktreeChangesUnknownWhenTheNamespaceFails(t *testing.T) {
	ctx := context.Background()
	wt := t.TempDir()
	for _, d := range []string{"a", "b/c"} {
		assert.NilError(t, os.MkdirAll(filepath.Join(wt, d), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(wt, d, "f.txt"), []byte("x"), 0o644))
	}
	cache := filepath.Join(t.TempDir(), diff.NamespaceCacheFile)
	aged := func() { time.Sleep(1100 * time.Millisecond) } // past the racy window
	aged()
	first, why := diff.ScanNamespace(ctx, wt, cache, nil)
	assert.Equal(t, why, "")
	assert.NilError(t, first.Keep())
	first.Close()
	aged()
	for _, broken := range []bool{false, true} {
		before, why := diff.ScanNamespace(ctx, wt, cache, nil)
		assert.Equal(t, why, "")
		assert.NilError(t, before.Settle())
		assert.NilError(t, before.Ready())
		if broken {
			before.Close()
		}
		got := worktreeChanges(ctx, before, nil, wt, &guard.Check{})
		before.Close()
		if !broken {
			assert.Equal(t, got.Error, "")
			assert.Assert(t, got.Summary != nil)
			assert.Equal(t, got.Added+got.Modified+got.Deleted, 0)
			continue
		}
		assert.Assert(t, got.Summary == nil, "%+v", got.Summary)
		assert.ErrorContains(t, before.Err(), "closed")
		assert.Equal(t, got.Error, before.Err().Error())
	}
}
