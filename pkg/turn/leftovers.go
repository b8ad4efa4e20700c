package turn

import (
	"context"

	"github.com/shrooms-cage/shrooms/pkg/cages"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// cages are the cages of the runner's state directory on its engine.
func (r *Runner) cages() cages.Cages {
	return cages.Cages{Engine: r.Podman, StateDir: r.Cfg.State.Dir}
}

// removeLeftovers removes cages of task that a crashed shrooms left behind
// (cages.Cages.RemoveLeftovers). Call it with the task lock held.
func (r *Runner) removeLeftovers(ctx context.Context, task taskid.ID, keep ...string) ([]string, error) {
	return r.cages().RemoveLeftovers(ctx, task, keep...)
}

// ours reports whether a cage was made by a shrooms with this state dir.
func (r *Runner) ours(c podman.Cage) bool { return r.cages().Ours(c) }
