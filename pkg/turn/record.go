package turn

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/homestore"
)

// TurnsFile holds one JSON line per turn of a task (its Result, reset
// report included), kept with the task until forget.
const TurnsFile = "turns.jsonl"

// recordTurn appends the turn's result to the task's log. Called at the end
// of Run with the task lock held; a turn that never started (turn 0) is not
// recorded.
func (r *Runner) recordTurn(res *Result, err error, start time.Time) error {
	if res == nil || res.Turn == 0 {
		return nil
	}
	rec := *res
	rec.TotalMs = ms(time.Since(start))
	if err != nil && rec.Error == "" {
		rec.Error = strings.Join(strings.Fields(err.Error()), " ")
	}
	b, merr := json.Marshal(&rec)
	if merr != nil {
		return fmt.Errorf("turn record: %w", merr)
	}
	f, oerr := os.OpenFile(filepath.Join(r.TaskDir(res.Task), TurnsFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if oerr != nil {
		return fmt.Errorf("turn record: %w", oerr)
	}
	defer f.Close()
	if _, werr := f.Write(append(b, '\n')); werr != nil {
		return fmt.Errorf("turn record: %w", werr)
	}
	return nil
}

// HomeBytes is the disk space the task HOME's filesystem image takes.
func (r *Runner) HomeBytes(task string) int64 {
	var fs unix.Stat_t
	if unix.Lstat(homestore.ImagePath(r.Cfg.State.Dir, r.Home().Name(task)), &fs) != nil {
		return 0
	}
	return fs.Blocks * 512
}
