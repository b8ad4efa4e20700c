package task

import (
	"context"

	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/profile"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// Bootstrap creates the task HOME once, under the task lock, seeding the
// credentials of the given HOME profiles (all profiles when none are
// given); an existing, bootstrapped HOME is left as it is. The HOME is
// released again unless a cage of the task holds it.
func (r *Commands) Bootstrap(ctx context.Context, task taskid.ID, profiles []string) (*home.BootstrapResult, error) {
	if len(profiles) == 0 {
		profiles = profile.Names()
	}
	st, err := r.Store.Task(task)
	if err != nil {
		return nil, turn.Classify(err)
	}
	lock, err := st.Lock()
	if err != nil {
		return nil, turn.Classify(err)
	}
	defer lock.Release()
	ids, err := r.Store.TaskIDs(task, r.IDFiles, true)
	if err != nil {
		return nil, fault.Wrap(fault.HostNotReady, err)
	}
	kept, err := home.Had(st)
	if err != nil {
		return nil, err
	}
	h, err := r.Homes.Open(ctx, task, kept)
	if err != nil {
		return nil, err
	}
	res, err := h.Bootstrap(ctx, home.TaskOf(r.Cfg, h.Root, ids, profiles, nil))
	if err != nil {
		h.Discard(ctx)
		return nil, fault.Wrapf(fault.HostNotReady, "bootstrap HOME: %w", err)
	}
	if res.Result == home.Bootstrapped {
		if err := home.RememberProfiles(st, profiles, nil); err != nil {
			return nil, err
		}
	}
	if !kept {
		if err := home.Remember(st, r.Homes.Name(task)); err != nil {
			return nil, err
		}
	}
	return res, r.releaseHome(ctx, task)
}
