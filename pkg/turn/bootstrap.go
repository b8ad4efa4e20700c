package turn

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// homes is the task HOME volumes of the runner's config on its engine.
func (r *Runner) homes() *home.Store { return home.NewStore(r.Podman, r.Cfg) }

// homeTask describes the task HOME to the reset (home.TaskOf).
func (r *Runner) homeTask(root string, ids taskstate.IDs, profiles, kept []string) home.Task {
	return home.TaskOf(r.Cfg, root, ids, profiles, kept)
}

// bootstrap opens the task HOME (creating its volume and capped filesystem
// when missing, repairing drift or refusing it with the fix) and seeds its
// credentials once; an existing, bootstrapped HOME is left as it is. It
// returns the volume's host directory.
func (r *Runner) bootstrap(ctx context.Context, id taskid.ID, vol home.Volume, st taskstate.Dir, ids taskstate.IDs, profiles []string) (string, *home.BootstrapResult, error) {
	kept, err := home.Had(st)
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
			h.DiscardHome(ctx, vol, root)
		}
		return "", nil, fmt.Errorf("%w: bootstrap HOME: %w", ErrHostNotReady, err)
	}
	if res.Result == home.Bootstrapped {
		if err := home.RememberProfiles(st, profiles, nil); err != nil {
			return "", nil, err
		}
	}
	if !kept {
		if err := home.Remember(st, vol.Name); err != nil {
			return "", nil, err
		}
	}
	return root, res, nil
}

// releaseHome unmounts task's HOME filesystem and frees its loop device
// when no cage of the task is left (a prepared one waiting on it, or one
// whose removal failed): HOME is mounted for the reset and the turn only,
// so nothing holds a loop device between turns and a `podman volume rm`
// between turns cannot reach into HOME. Call it with the task lock held.
// An unknown podman state keeps the mount.
func (r *Runner) releaseHome(ctx context.Context, task taskid.ID) error {
	if busy, err := r.cages().InUse(ctx, task); err != nil || busy {
		return err
	}
	return r.host().ReleaseHome(task)
}

// noSpaceHint names where room is needed when err is ENOSPC: a full host
// filesystem under the HOME images shows inside HOME as ENOSPC too.
func (r *Runner) noSpaceHint(err error) string {
	if !errors.Is(err, unix.ENOSPC) && !strings.Contains(err.Error(), unix.ENOSPC.Error()) {
		return ""
	}
	return "; free space on the filesystem of " + taskstate.Layout{Dir: r.Cfg.State.Dir}.Homes() + " (the HOME images)"
}
