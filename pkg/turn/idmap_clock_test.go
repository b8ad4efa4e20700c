package turn

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// TestIdmapStartAfterTheStepTimer: the idmapped turn's start, from which
// the give-back strips the setuid bits of files whose ctime is at or
// after it, is read only once the clock-step timer is armed (it is the
// coarse clock read right then): a step of the clock between an earlier
// reading and the arming would leave the turn's ctimes before the start,
// unseen, and its setuid files kept. The positive control: the timer is
// armed and has seen no step.
func TestIdmapStartAfterTheStepTimer(t *testing.T) {
	e, runner := newHarness(t, "")
	wt := idmapTree(t, e, runner)
	task := e.Task("clock")
	_, _, eo, err := sh(runner, task, wt, "true")
	assert.NilError(t, err, eo)
	ids, err := runner.Store.TaskIDs(taskid.Must(task), runner.IDFiles, false)
	assert.NilError(t, err)
	lock, err := runner.Store.LockTask(taskid.Must(task))
	assert.NilError(t, err)
	before, err := runner.claims().TakeIdmapped(context.Background(), mustHolder(t, runner, task), wt, ids, true, nil)
	lock.Release()
	assert.NilError(t, err)
	defer before.Close()
	// The take's staging mount goes with the give-back of an idle task.
	defer func() {
		_, err := runner.claims().GiveBackIdle()
		assert.NilError(t, err)
		assert.Assert(t, !staged(t, runner, task))
	}()
	assert.Assert(t, before.ClockArmed() > 0, "positive control: the step timer is armed")
	assert.Assert(t, !before.ClockStepped())
	b, err := os.ReadFile(filepath.Join(runner.Cfg.State.Dir, "idmap", task+".turn.json"))
	assert.NilError(t, err)
	var rec struct {
		Start int64 `json:"start_unix_nano"`
	}
	assert.NilError(t, json.Unmarshal(b, &rec))
	// The very reading taken once the timer was armed (an earlier one is
	// below it, or equal within one coarse tick).
	assert.Equal(t, rec.Start, before.ClockArmed(), "the turn's start was not read once the step timer was armed")
}
