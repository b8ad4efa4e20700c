package turn

import (
	"context"
	"fmt"
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

// prepareOutbox moves what the task's last turn left in its outbox (a
// killed turn's, say) to its pending delivery and mounts the turn's empty
// outbox. A cage prepared ahead records which tmpfs it was given (record,
// in the task's directory, taskDir).
func (r *Runner) prepareOutbox(ctx context.Context, task taskid.ID, taskDir string, p *Plan, record bool) error {
	dev, err := r.host().PrepareOutbox(ctx, r.Cfg.Outbox.Root, task, p.turn-1, p.home.UID, p.home.GID, outbox.LimitsFrom(r.Cfg.Outbox))
	if err != nil {
		return fmt.Errorf("%w: outbox: %w", ErrHostNotReady, err)
	}
	if !record {
		return nil
	}
	if err := os.WriteFile(filepath.Join(taskDir, outboxDevFile), []byte(strconv.FormatUint(dev, 10)), 0o600); err != nil {
		return fmt.Errorf("%w: outbox: %w", ErrHostNotReady, err)
	}
	return nil
}

// preparedOutboxReady reports whether the outbox a prepared cage of task
// was given (its device recorded in the task's directory, taskDir) is still
// mounted, capped and empty: a cage whose outbox went (a reboot, `outbox
// release`) would get the bare directory when started.
func (r *Runner) preparedOutboxReady(task taskid.ID, taskDir string, p *Plan) bool {
	b, err := os.ReadFile(filepath.Join(taskDir, outboxDevFile))
	if err != nil {
		return false
	}
	dev, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return false
	}
	return r.host().OutboxReady(r.Cfg.Outbox.Root, task, p.home.UID, p.home.GID, outbox.LimitsFrom(r.Cfg.Outbox), dev) == nil
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
