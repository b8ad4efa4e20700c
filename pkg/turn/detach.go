package turn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// Teardown is what is left of a turn once its result is known: the exited
// cage, the turn's token secrets and the old HOME tree. A Detacher hands it
// to a child process that outlives the caller's shrooms.
type Teardown struct {
	Task  taskid.ID
	Agent string
	// Cage is the turn's cage (exited); "" when not known.
	Cage    string
	Secrets []string
	// Lock and LockDir are the task lock's files (taskstate.Lock.HandOff):
	// the child inherits them and holds the task until its work is done.
	Lock, LockDir *os.File
}

// Detacher starts the detached teardown of a turn and returns the child's
// process id. The child calls FinishTeardown.
type Detacher func(Teardown) (pid int, err error)

// handOff passes the turn's teardown to r.Detach; if that fails, the cage
// is removed here, as without a Detacher.
func (r *Runner) handOff(lock *taskstate.Lock, task taskid.ID, in *checked, p *prepared, res *Result) {
	f, dir, err := lock.HandOff()
	if err == nil {
		var pid int
		if pid, err = r.Detach(Teardown{Task: task, Agent: in.agentName, Cage: res.Cage, Secrets: p.secrets, Lock: f, LockDir: dir}); err == nil {
			res.Teardown, res.TeardownPID = "detached", pid
			_ = lock.MarkTeardown(pid)
			return
		}
		_ = lock.Reclaim()
	}
	ctx := context.Background()
	r.remove(ctx, res.Cage, res)
	r.removeSecrets(p.secrets)
	if p.root != "" {
		_ = r.host().Cleanup(ctx, p.root)
	}
}

// FinishTeardown is the detached child's work, under the task lock handed
// to it: remove the task's exited cages (every cage of the task but a
// prepared one still waiting), its turn secrets and the old HOME tree, then,
// with next, prepare the task's next cage. A child killed half-way leaves
// what any crash leaves: the next turn or gc removes it.
func (r *Runner) FinishTeardown(ctx context.Context, lock *taskstate.Lock, td Teardown, next *Request) error {
	defer lock.Release()
	// Turns that are starting go first (a burst of them, typically).
	r.Store.WaitStarts(ctx, 2*time.Second)
	if next != nil && td.Cage != "" && len(td.Secrets) == 0 {
		// The next cage first, the exited one's removal after the lock is
		// free: the task's next turn waits for its cage, not for podman's
		// removal of the last one (an exited cage runs nothing and holds
		// nothing a turn uses; a turn that sweeps it meanwhile is harmless,
		// a removal of a removed cage is not an error). A turn with token
		// secrets keeps the old order: its next cage's secrets have the
		// same names.
		if in, err := r.check(ctx, *next, aheadSteps()); err == nil {
			if _, seen, err := r.prepareNextKeeping(ctx, next.Task, in, td.Cage); err == nil {
				// HOME stays mounted: the cage just prepared on it holds it.
				lock.Release()
				// Turns that started meanwhile go first again: the removal
				// is podman's work (netns, mounts, its database) and the
				// exited cage holds nothing a turn needs.
				r.Store.WaitStarts(ctx, 2*time.Second)
				if r.BeforeLateRemove != nil {
					r.BeforeLateRemove()
				}
				if err := r.removeTaskCage(ctx, td.Task, td.Cage, seen); err != nil {
					return fmt.Errorf("remove cage: %w", err)
				}
				return nil
			}
		}
		// The next cage could not be prepared: the usual order says why.
	}
	var errs []error
	// The turn's cage is the task's only one: a prepared cage was taken by
	// the turn, or swept before it.
	if _, _, err := r.cages().RemoveLeftovers(ctx, td.Task); err != nil {
		errs = append(errs, fmt.Errorf("remove cage: %w", err))
	}
	var secrets []string
	for _, s := range td.Secrets {
		// Only this task's secrets (names as SecretName makes them).
		if strings.HasPrefix(s, SecretName(td.Task, "")) {
			secrets = append(secrets, s)
		}
	}
	r.removeSecrets(secrets)
	if root, err := r.host().HomeRoot(ctx, r.homes().Volume(td.Task)); err == nil {
		if err := r.host().Cleanup(ctx, root); err != nil {
			errs = append(errs, fmt.Errorf("HOME cleanup: %w", err))
		}
	}
	if next != nil {
		in, err := r.check(ctx, *next, aheadSteps())
		if err == nil {
			_, err = r.prepareNextLocked(ctx, next.Task, in)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("next cage not prepared: %w", err))
		}
	}
	// Last: HOME is unmounted until the next turn, unless the next cage
	// was prepared on it.
	if err := r.releaseHome(ctx, td.Task); err != nil {
		errs = append(errs, fmt.Errorf("release HOME: %w", err))
	}
	return errors.Join(errs...)
}

// removeTaskCage removes the task's cage id (and no other: without the
// task lock, another turn of the task may be running) if the task's
// listing, seen, showed it as the task's own: no inspection of it, as a
// cage's id and labels never change (a cage removed meanwhile is no
// error to remove).
func (r *Runner) removeTaskCage(ctx context.Context, task taskid.ID, id string, seen []podman.Cage) error {
	for _, c := range seen {
		if c.ID == id && c.Labels[sealed.LabelTask] == task.String() && r.ours(c) {
			return r.Podman.Remove(ctx, c.ID)
		}
	}
	return nil
}
