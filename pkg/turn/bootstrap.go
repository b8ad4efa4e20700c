package turn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// Home is the task HOME volumes of the runner's config on its engine.
func (r *Runner) Home() *home.Store { return home.NewStore(r.Podman, r.Cfg) }

// homeTask describes the task HOME to the reset (home.TaskOf).
func (r *Runner) homeTask(root string, ids taskstate.IDs, profiles, kept []string) home.Task {
	return home.TaskOf(r.Cfg, root, ids, profiles, kept)
}

// bootstrap opens the task HOME (creating its volume and capped filesystem
// when missing, repairing drift or refusing it with the fix) and seeds its
// credentials once; an existing, bootstrapped HOME is left as it is. It
// returns the volume's host directory.
func (r *Runner) bootstrap(ctx context.Context, id taskid.ID, ids taskstate.IDs, profiles []string) (string, *home.BootstrapResult, error) {
	kept, err := r.hadHome(id)
	if err != nil {
		return "", nil, err
	}
	h := r.host()
	root, created, err := h.OpenHome(ctx, id, kept)
	if err != nil {
		return "", nil, err
	}
	res, err := h.Bootstrap(ctx, r.homeTask(root, ids, profiles, nil))
	if err != nil {
		if created {
			h.DiscardHome(ctx, id, root)
		}
		return "", nil, fmt.Errorf("%w: bootstrap HOME: %w", ErrHostNotReady, err)
	}
	if res.Result == home.Bootstrapped {
		if err := r.rememberProfiles(id, profiles, nil); err != nil {
			return "", nil, err
		}
	}
	if !kept {
		if err := r.Store.Remember(id, taskstate.FactHome, r.Home().Name(id)); err != nil {
			return "", nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
	}
	return root, res, nil
}

// hadHome reports whether the task had a HOME made (then a missing image is
// drift, never a new start): its home fact, or turns from before the fact.
func (r *Runner) hadHome(task taskid.ID) (bool, error) {
	fact, err := r.Store.Recall(task, taskstate.FactHome)
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if fact != "" {
		return true, nil
	}
	n, _ := r.Store.LastTurn(task)
	return n > 0, nil
}

// ReleaseHome unmounts task's HOME filesystem and frees its loop device
// when no cage of the task is left (a prepared one waiting on it, or one
// whose removal failed): HOME is mounted for the reset and the turn only,
// so nothing holds a loop device between turns and a `podman volume rm`
// between turns cannot reach into HOME. Call it with the task lock held.
// An unknown podman state keeps the mount.
func (r *Runner) ReleaseHome(ctx context.Context, task taskid.ID) error {
	if busy, err := r.HomeInUse(ctx, task); err != nil || busy {
		return err
	}
	return r.host().ReleaseHome(task)
}

// HomeInUse reports whether any cage of task exists (whatever its state):
// its HOME must stay mounted for it.
func (r *Runner) HomeInUse(ctx context.Context, task taskid.ID) (bool, error) {
	cages, err := r.Podman.ListByLabel(ctx, sealed.LabelTask, task.String())
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	for _, c := range cages {
		if r.ours(c) {
			return true, nil
		}
	}
	return false, nil
}

// noSpaceHint names where room is needed when err is ENOSPC: a full host
// filesystem under the HOME images shows inside HOME as ENOSPC too.
func (r *Runner) noSpaceHint(err error) string {
	if !errors.Is(err, unix.ENOSPC) && !strings.Contains(err.Error(), unix.ENOSPC.Error()) {
		return ""
	}
	return "; free space on the filesystem of " + taskstate.Layout{Dir: r.Cfg.State.Dir}.Homes() + " (the HOME images)"
}

// rememberProfiles records that task's HOME holds state of profiles (with
// kept, those it held before), before the reset that may carry it over.
func (r *Runner) rememberProfiles(task taskid.ID, profiles, kept []string) error {
	all := append(slices.Clone(kept), profiles...)
	slices.Sort(all)
	all = slices.Compact(all)
	if err := r.Store.Remember(task, taskstate.FactProfiles, strings.Join(all, ",")); err != nil {
		return fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	return nil
}
