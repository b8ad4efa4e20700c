package turn

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// TurnsFile holds one JSON line per turn of a task (its Result, reset
// report included), kept with the task until forget.
const TurnsFile = taskstate.TurnsFile

// recordTurn appends the turn's result to the task's log. Called at the end
// of Run with the task lock held; a turn that never started (turn 0) is not
// recorded.
func (r *Runner) recordTurn(task taskid.ID, res *Result, err error, start time.Time) error {
	if res == nil || res.Turn == 0 {
		return nil
	}
	rec := *res
	rec.TotalMs = ms(time.Since(start))
	rec.EndedAt = taskstate.Now()
	if err != nil && rec.Error == "" {
		rec.Error = strings.Join(strings.Fields(err.Error()), " ")
	}
	b, merr := json.Marshal(&rec)
	if merr != nil {
		return fmt.Errorf("turn record: %w", merr)
	}
	return r.Store.AppendRecord(task, b)
}

// markRunning keeps what is known of the running turn as its record, should
// its shrooms die before recordTurn (taskstate.Store.MarkRunning). Best
// effort: without the mark a killed turn only goes unrecorded.
func (r *Runner) markRunning(st taskstate.Dir, res *Result) {
	rec := Result{Task: res.Task, Agent: res.Agent, Turn: res.Turn, Status: "killed", ExitCode: -1, StartedAt: res.StartedAt,
		Prepared: res.Prepared, ConfigDigest: res.ConfigDigest, SealDigest: res.SealDigest, Image: res.Image, Phases: []Phase{}}
	if b, err := json.Marshal(&rec); err == nil {
		_ = st.MarkRunning(b)
	}
}
