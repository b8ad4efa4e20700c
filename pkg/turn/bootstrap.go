package turn

import (
	"context"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/homereset"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// Bootstrap outcomes, as homereset reports them.
const (
	Bootstrapped        = "bootstrapped"
	AlreadyBootstrapped = "already-bootstrapped"
)

// VolumeName is the task HOME volume's name.
func (r *Runner) VolumeName(task string) string { return r.Cfg.Home.VolumePrefix + task }

// homeTask describes the task HOME to the reset.
func (r *Runner) homeTask(root string, ids taskstate.IDs, profiles []string) homereset.Task {
	return homereset.Task{
		Root:     root,
		UID:      int(ids.UID) + int(r.Cfg.Cage.User),
		GID:      int(ids.GID) + int(r.Cfg.Cage.User),
		Config:   r.Cfg,
		Profiles: profiles,
	}
}

// bootstrap creates the task HOME volume if it is missing and seeds its
// credentials once; an existing, bootstrapped HOME is left as it is. It
// returns the volume's host directory.
func (r *Runner) bootstrap(ctx context.Context, task string, ids taskstate.IDs, profiles []string) (string, *homereset.BootstrapResult, error) {
	name := r.VolumeName(task)
	exists, err := r.Podman.VolumeExists(ctx, name)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %v", ErrHostNotReady, err)
	}
	var root string
	if exists {
		v, err := r.Podman.InspectVolume(ctx, name)
		if err != nil {
			return "", nil, fmt.Errorf("%w: %v", ErrHostNotReady, err)
		}
		if v.Labels[sealed.LabelTask] != task {
			return "", nil, fmt.Errorf("%w: volume %s exists but is not task %s's HOME (label %s=%q); remove or rename it", ErrHostNotReady, name, task, sealed.LabelTask, v.Labels[sealed.LabelTask])
		}
		root = v.Mountpoint
	} else {
		if root, err = r.Podman.CreateVolume(ctx, name, map[string]string{sealed.LabelManaged: "1", sealed.LabelTask: task}); err != nil {
			return "", nil, fmt.Errorf("%w: %v", ErrHostNotReady, err)
		}
		// The volume root stays root's and private; HOME lives inside it.
		if err := unix.Fchmodat(unix.AT_FDCWD, root, 0o700, 0); err != nil {
			_ = r.Podman.RemoveVolume(ctx, name)
			return "", nil, fmt.Errorf("%w: HOME volume %s mode: %v", ErrHostNotReady, name, err)
		}
	}
	res, err := homereset.Bootstrap(ctx, r.homeTask(root, ids, profiles))
	if err != nil {
		if !exists {
			_ = r.Podman.RemoveVolume(ctx, name)
		}
		return "", nil, fmt.Errorf("%w: bootstrap HOME: %v", ErrHostNotReady, err)
	}
	return root, res, nil
}

// volumeRoot is the host directory the task HOME volume has, or will have
// once created (for `spec`, which creates nothing).
func (r *Runner) volumeRoot(ctx context.Context, task string) (string, error) {
	name := r.VolumeName(task)
	exists, err := r.Podman.VolumeExists(ctx, name)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrHostNotReady, err)
	}
	if exists {
		v, err := r.Podman.InspectVolume(ctx, name)
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrHostNotReady, err)
		}
		return v.Mountpoint, nil
	}
	info, err := r.Podman.Info(ctx)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrHostNotReady, err)
	}
	return filepath.Join(info.GraphRoot, "volumes", name, "_data"), nil
}
