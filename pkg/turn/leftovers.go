package turn

import (
	"context"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"slices"

	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
)

// RemoveLeftovers removes cages of task that a crashed shrooms left behind.
// Call it with the task lock held: no turn of the task can be running.
func (r *Runner) RemoveLeftovers(ctx context.Context, task taskid.ID, keep ...string) ([]string, error) {
	cages, err := r.Podman.ListByLabel(ctx, sealed.LabelTask, task.String())
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, c := range cages {
		if !r.ours(c) || slices.Contains(keep, c.ID) {
			continue
		}
		if err := r.Podman.Remove(ctx, c.ID); err != nil {
			return removed, err
		}
		removed = append(removed, c.Name)
	}
	return removed, nil
}

// ours reports whether a cage was made by a shrooms with this state dir.
func (r *Runner) ours(c podman.Cage) bool { return sealed.Ours(r.Cfg.State.Dir, c.Labels) }
