package turn

import (
	"context"
	"fmt"

	"github.com/shrooms-cage/shrooms/pkg/homereset"
	"github.com/shrooms-cage/shrooms/pkg/homestore"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// Home is the task HOME volumes of the runner's config on its engine.
func (r *Runner) Home() *homestore.Volumes {
	return &homestore.Volumes{
		Engine:   r.Podman,
		StateDir: r.Cfg.State.Dir,
		Prefix:   r.Cfg.Home.VolumePrefix,
		Socket:   r.Cfg.Podman.Socket,
		Limits:   homestore.Limits{Size: int64(r.Cfg.Home.Size), Inodes: r.Cfg.Home.Inodes},
	}
}

// HomeTask describes the task HOME to the reset.
func (r *Runner) HomeTask(root string, ids taskstate.IDs, profiles []string) homereset.Task {
	return homereset.Task{
		Root:     root,
		UID:      int(ids.UID) + int(r.Cfg.Cage.User),
		GID:      int(ids.GID) + int(r.Cfg.Cage.User),
		Config:   r.Cfg,
		Profiles: profiles,
	}
}

// bootstrap opens the task HOME (creating its volume and capped filesystem
// when missing) and seeds its credentials once; an existing, bootstrapped
// HOME is left as it is. It returns the volume's host directory.
func (r *Runner) bootstrap(ctx context.Context, task string, ids taskstate.IDs, profiles []string) (string, *homereset.BootstrapResult, error) {
	home := r.host()
	root, created, err := home.OpenHome(ctx, task)
	if err != nil {
		return "", nil, err
	}
	res, err := home.Bootstrap(ctx, r.HomeTask(root, ids, profiles))
	if err != nil {
		if created {
			home.DiscardHome(ctx, task, root)
		}
		return "", nil, fmt.Errorf("%w: bootstrap HOME: %w", ErrHostNotReady, err)
	}
	return root, res, nil
}
