package turn

import (
	"github.com/shrooms-cage/shrooms/pkg/cages"
	"github.com/shrooms-cage/shrooms/pkg/podman"
)

// cages are the cages of the runner's state directory on its engine:
// those a crash left (RemoveLeftovers, with the task lock held), and
// whether one still holds the task's HOME (InUse).
func (r *Runner) cages() cages.Cages {
	return cages.Cages{Engine: r.Podman, StateDir: r.Cfg.State.Dir}
}

// ours reports whether a cage was made by a shrooms with this state dir.
func (r *Runner) ours(c podman.Cage) bool { return r.cages().Ours(c) }
