package turn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/gitseal"
	"github.com/shrooms-cage/shrooms/pkg/homereset"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// ErrUnknownTask is a task shrooms has no state of.
var ErrUnknownTask = errors.New("unknown task")

// withTask runs f under the task lock, for a task that exists.
func (r *Runner) withTask(task string, f func() error) error {
	ok, err := r.Store.Exists(task)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInput, err)
	}
	if !ok {
		return fmt.Errorf("%w: %w %q (no turn has run for it)", ErrInput, ErrUnknownTask, task)
	}
	lock, err := r.Store.LockTask(task)
	if err != nil {
		return classify(err)
	}
	defer lock.Release()
	return f()
}

// Collect moves what the task's last turn left in its outbox into to (or a
// new directory under the state dir), under the task lock so no turn is
// writing meanwhile.
func (r *Runner) Collect(ctx context.Context, task, to string) (*outbox.Report, error) {
	var rep *outbox.Report
	err := r.withTask(task, func() error {
		wt, err := r.Store.Recall(task, taskstate.FactWorktree)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrHostNotReady, err)
		}
		if to == "" {
			to = filepath.Join(r.Cfg.State.Dir, "deliveries", task, time.Now().UTC().Format("20060102T150405.000000000Z"))
		}
		cctx, cancel := context.WithTimeout(ctx, r.Cfg.Outbox.CollectTimeout.Std())
		defer cancel()
		rep, err = outbox.Collect(cctx, outbox.Request{Root: r.Cfg.Outbox.Root, Task: task, To: to, Limits: outbox.LimitsFrom(r.Cfg.Outbox), Worktree: wt})
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInput, err)
		}
		return nil
	})
	return rep, err
}

// ListOutbox reports what Collect would deliver, changing nothing.
func (r *Runner) ListOutbox(ctx context.Context, task string) (*outbox.Report, error) {
	var rep *outbox.Report
	err := r.withTask(task, func() error {
		var err error
		rep, err = outbox.List(ctx, r.Cfg.Outbox.Root, task, outbox.LimitsFrom(r.Cfg.Outbox))
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInput, err)
		}
		return nil
	})
	return rep, err
}

// ReleaseOutbox unmounts the task's outbox, discarding what is left in it.
func (r *Runner) ReleaseOutbox(task string) error {
	return r.withTask(task, func() error {
		if err := outbox.Release(r.Cfg.Outbox.Root, task); err != nil {
			return fmt.Errorf("%w: %v", ErrHostNotReady, err)
		}
		return nil
	})
}

// Commit commits the task's worktree on the host in a sealed git
// environment, under the task lock so the cage cannot race it.
func (r *Runner) Commit(ctx context.Context, task, message string, author gitseal.Author) (string, error) {
	var id string
	err := r.withTask(task, func() error {
		wt, err := r.Store.Recall(task, taskstate.FactWorktree)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrHostNotReady, err)
		}
		if wt == "" {
			return fmt.Errorf("%w: task %q has no worktree (run it with --worktree)", ErrInput, task)
		}
		id, err = gitseal.Commit(ctx, wt, message, author)
		if err != nil && !errors.Is(err, gitseal.ErrNothingToCommit) {
			return fmt.Errorf("%w: %v", ErrInput, err)
		}
		return err
	})
	return id, err
}

// Reset resets the task HOME now (or, with dryRun, reports what a reset
// would do). agent "" means the agent of the task's last turn.
func (r *Runner) Reset(ctx context.Context, task, agent string, dryRun bool) (*homereset.Report, error) {
	var rep *homereset.Report
	err := r.withTask(task, func() error {
		if agent == "" {
			var err error
			if agent, err = r.Store.Recall(task, taskstate.FactAgent); err != nil {
				return fmt.Errorf("%w: %v", ErrHostNotReady, err)
			}
			if agent == "" {
				return fmt.Errorf("%w: task %q has run no agent yet; pass --agent", ErrInput, task)
			}
		}
		a, err := r.Cfg.Agent(agent)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInput, err)
		}
		ids, err := r.Store.TaskIDs(task, r.IDFiles, false)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrHostNotReady, err)
		}
		root, err := r.HomeRoot(ctx, task)
		if err != nil {
			return err
		}
		rep, err = homereset.Reset(ctx, homereset.ResetInput{Task: r.homeTask(root, ids, a.Home), DryRun: dryRun})
		if err != nil {
			return fmt.Errorf("%w: HOME reset: %v", ErrHostNotReady, err)
		}
		if !dryRun {
			if _, err := homereset.Cleanup(ctx, root); err != nil {
				return fmt.Errorf("%w: HOME cleanup: %v", ErrHostNotReady, err)
			}
		}
		return nil
	})
	return rep, err
}

// Forget removes everything shrooms keeps of a task: its cages (prepared
// ones too), its HOME (volume and capped filesystem), its outbox, its token
// secrets and its state (lock, turn counter, user-namespace slot, which
// becomes free for a new task). The worktree and delivered outboxes stay.
func (r *Runner) Forget(ctx context.Context, task string) error {
	return r.withTask(task, func() error {
		if _, err := r.removeLeftovers(ctx, task); err != nil {
			return fmt.Errorf("%w: %v", ErrHostNotReady, err)
		}
		if err := r.releaseWorktrees(task); err != nil {
			return fmt.Errorf("%w: %v", ErrHostNotReady, err)
		}
		if err := r.RemoveHome(ctx, task); err != nil {
			return err
		}
		if _, err := os.Stat(r.Cfg.Outbox.Root); err == nil {
			if err := outbox.Release(r.Cfg.Outbox.Root, task); err != nil {
				return fmt.Errorf("%w: %v", ErrHostNotReady, err)
			}
		}
		for name := range r.Cfg.Tokens {
			_ = r.Podman.RemoveSecret(ctx, SecretName(task, name))
		}
		if err := os.RemoveAll(r.taskDir(task)); err != nil {
			return fmt.Errorf("%w: remove task state: %v", ErrHostNotReady, err)
		}
		return nil
	})
}
