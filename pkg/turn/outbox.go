package turn

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// The outbox is one-way: every turn gets a fresh, empty tmpfs at /outbox,
// and what the turn put there is moved to the task's pending deliveries
// when it ends (outbox.Settle), so no later turn reads it.

// outboxDevFile holds the device of the outbox tmpfs a prepared cage was
// given, so the turn that takes the cage can check it still is that one.
const outboxDevFile = "outbox-dev"

// recordOutbox records, in the task's directory (taskDir), the device of
// the outbox tmpfs a cage prepared ahead was given (Host.PrepareOutbox's).
func recordOutbox(taskDir string, dev uint64) error {
	return os.WriteFile(filepath.Join(taskDir, outboxDevFile), []byte(strconv.FormatUint(dev, 10)), 0o600)
}

// recordedOutbox is the device recordOutbox recorded in taskDir (false:
// none that can be read). The turn that takes the prepared cage checks its
// outbox still is that tmpfs, mounted, capped and empty
// (Host.OutboxReady): a cage whose outbox went (a reboot, `outbox
// release`) would get the bare directory when started.
func recordedOutbox(taskDir string) (uint64, bool) {
	b, err := os.ReadFile(filepath.Join(taskDir, outboxDevFile))
	if err != nil {
		return 0, false
	}
	dev, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return dev, err == nil
}

// settleOutbox moves what the task's last turn put in /outbox to its
// pending delivery, once no process of its cage runs, and says so in res.
// A failure leaves the outbox where it is (the next turn refuses to start
// on it) and is reported, not fatal: the turn itself ran.
func (r *Runner) settleOutbox(ctx context.Context, id taskid.ID, st taskstate.Dir, res *Result) {
	last, err := st.LastTurn()
	if err != nil {
		res.Outbox = &outbox.Summary{Turn: res.Turn, Error: err.Error()}
		return
	}
	start := time.Now()
	m, err := r.host().SettleOutbox(ctx, r.Cfg.Outbox.Root, id, last, outbox.LimitsFrom(r.Cfg.Outbox))
	switch {
	case err != nil:
		res.Outbox = &outbox.Summary{Turn: last, Error: err.Error()}
	case m != nil:
		s := m.Summarize()
		res.Outbox = &s
	default:
		return
	}
	res.Outbox.MoveMs = ms(time.Since(start))
}
