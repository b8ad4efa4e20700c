package turn

import (
	"context"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// TestIdmapScanBeforeTakesTheGuardsStats: an idmapped turn's scan before
// takes each directory's stat from the turn's guard scan and stats itself
// only those the guard does not walk (the nested repository's .git and
// below); a turn whose claim first gives back a killed turn (owners and
// modes changed after the guard's scan) drops the guard's stats and stats
// every directory itself. The next turn shares them again (the control).
func TestIdmapScanBeforeTakesTheGuardsStats(t *testing.T) {
	e, runner := newHarness(t, "")
	wt := idmapTree(t, e, runner)
	task := e.Task("share")
	_, _, eo, err := sh(runner, task, wt, "true")
	assert.NilError(t, err, eo)
	const onlyNamespace = 3 // sub/.git, sub/.git/objects, sub/.git/refs
	shares := func() {
		t.Helper()
		res, _, eo, err := sh(runner, task, wt, "true")
		assert.NilError(t, err, eo)
		s := res.WorktreeChanges.Summary
		assert.Assert(t, strings.HasPrefix(s.ScanBefore, "namespace"), s.ScanBefore)
		assert.Equal(t, s.DirsStatted, onlyNamespace, "%+v", s)
		assert.Equal(t, s.DirsStatShared, s.DirsRevalidated-1-onlyNamespace, "%+v", s)
		assert.Assert(t, s.DirsStatShared > 0)
	}
	shares()

	// A turn killed after its take: its record is left for the next
	// turn's claim to give back.
	ids, err := runner.Store.TaskIDs(taskid.Must(task), runner.IDFiles, false)
	assert.NilError(t, err)
	lock, err := runner.Store.LockTask(taskid.Must(task))
	assert.NilError(t, err)
	before, err := runner.claims().TakeIdmapped(context.Background(), mustHolder(t, runner, task), wt, ids, true, nil)
	lock.Release()
	assert.NilError(t, err)
	before.Close()
	res, _, eo, err := sh(runner, task, wt, "true")
	assert.NilError(t, err, eo)
	s := res.WorktreeChanges.Summary
	assert.Assert(t, strings.HasPrefix(s.ScanBefore, "namespace"), s.ScanBefore)
	assert.Equal(t, s.DirsStatShared, 0, "the guard's stats predate the give-back: %+v", s)
	assert.Equal(t, s.DirsStatted, s.DirsRevalidated-1, "%+v", s)

	shares()
}
