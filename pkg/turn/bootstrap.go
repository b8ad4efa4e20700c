package turn

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/homereset"
	"github.com/shrooms-cage/shrooms/pkg/homestore"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
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

// bootstrap creates the task HOME volume if it is missing, mounts its
// size-capped filesystem (creating it with a new volume) and seeds its
// credentials once; an existing, bootstrapped HOME is left as it is. It
// returns the volume's host directory.
func (r *Runner) bootstrap(ctx context.Context, task string, ids taskstate.IDs, profiles []string) (string, *homereset.BootstrapResult, error) {
	name := r.VolumeName(task)
	exists, err := r.Podman.VolumeExists(ctx, name)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %v", ErrHostNotReady, err)
	}
	peers, err := r.podmanNamespace()
	if err != nil {
		return "", nil, err
	}
	image := homestore.ImagePath(r.Cfg.State.Dir, name)
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
		// An image without its volume is what a removed HOME left behind:
		// a new volume starts from a new, empty filesystem.
		if err := homestore.Remove(image, "", peers...); err != nil {
			return "", nil, fmt.Errorf("%w: stale HOME image: %v", ErrHostNotReady, err)
		}
		if root, err = r.Podman.CreateVolume(ctx, name, map[string]string{sealed.LabelManaged: "1", sealed.LabelTask: task}); err != nil {
			return "", nil, fmt.Errorf("%w: %v", ErrHostNotReady, err)
		}
		// The volume root stays root's and private; HOME lives inside it.
		if err := unix.Fchmodat(unix.AT_FDCWD, root, 0o700, 0); err != nil {
			_ = r.Podman.RemoveVolume(ctx, name)
			return "", nil, fmt.Errorf("%w: HOME volume %s mode: %v", ErrHostNotReady, name, err)
		}
	}
	// Every turn: the capped filesystem is mounted on the volume (again,
	// after a reboot), so all HOME writes, and the reset, happen inside it.
	lim := homestore.Limits{Size: int64(r.Cfg.Home.Size), Inodes: r.Cfg.Home.Inodes}
	if _, err := homestore.Ensure(ctx, image, root, lim, peers...); err != nil {
		if !exists {
			_ = homestore.Remove(image, root, peers...)
			_ = r.Podman.RemoveVolume(ctx, name)
		}
		return "", nil, fmt.Errorf("%w: size-capped HOME: %v", ErrHostNotReady, err)
	}
	res, err := homereset.Bootstrap(ctx, r.homeTask(root, ids, profiles))
	if err != nil {
		if !exists {
			_ = homestore.Remove(image, root, peers...)
			_ = r.Podman.RemoveVolume(ctx, name)
		}
		return "", nil, fmt.Errorf("%w: bootstrap HOME: %v", ErrHostNotReady, err)
	}
	return root, res, nil
}

// podmanNamespace names the podman service's mount namespace when it is not
// shrooms' own (a service in a private namespace would otherwise give the
// cage the bare volume directory instead of the capped HOME).
func (r *Runner) podmanNamespace() ([]string, error) {
	sock, ok := strings.CutPrefix(r.Cfg.Podman.Socket, "unix://")
	if !ok {
		return nil, nil
	}
	ns, err := homestore.ServiceNamespace(sock)
	if err != nil {
		return nil, fmt.Errorf("%w: podman service: %v", ErrHostNotReady, err)
	}
	return []string{ns}, nil
}

// RemoveHome removes task's HOME: its size-capped filesystem (unmounted
// first) and its volume. gc, reset and tests call it instead of removing
// the volume alone, which would leave the mount and loop device behind. A
// missing HOME is not an error.
func (r *Runner) RemoveHome(ctx context.Context, task string) error {
	name := r.VolumeName(task)
	peers, err := r.podmanNamespace()
	if err != nil {
		return err
	}
	mountpoint := ""
	exists, err := r.Podman.VolumeExists(ctx, name)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrHostNotReady, err)
	}
	if exists {
		v, err := r.Podman.InspectVolume(ctx, name)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrHostNotReady, err)
		}
		mountpoint = v.Mountpoint
	}
	if err := homestore.Remove(homestore.ImagePath(r.Cfg.State.Dir, name), mountpoint, peers...); err != nil {
		return fmt.Errorf("%w: remove HOME of %s: %v", ErrHostNotReady, task, err)
	}
	if exists {
		if err := r.Podman.RemoveVolume(ctx, name); err != nil {
			return fmt.Errorf("%w: remove HOME volume %s: %v", ErrHostNotReady, name, err)
		}
	}
	return nil
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

// HomeRoot returns the host directory of task's existing HOME with its
// size-capped filesystem mounted (mounting it, e.g. after a reboot). Code
// that touches an existing HOME outside a turn (gc's homereset.Cleanup) must
// use it: on the bare volume directory it would write where the capped
// filesystem is later mounted, which Ensure then refuses.
func (r *Runner) HomeRoot(ctx context.Context, task string) (string, error) {
	name := r.VolumeName(task)
	v, err := r.Podman.InspectVolume(ctx, name)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrHostNotReady, err)
	}
	if v.Labels[sealed.LabelTask] != task {
		return "", fmt.Errorf("%w: volume %s is not task %s's HOME", ErrHostNotReady, name, task)
	}
	peers, err := r.podmanNamespace()
	if err != nil {
		return "", err
	}
	lim := homestore.Limits{Size: int64(r.Cfg.Home.Size), Inodes: r.Cfg.Home.Inodes}
	if _, err := homestore.Ensure(ctx, homestore.ImagePath(r.Cfg.State.Dir, name), v.Mountpoint, lim, peers...); err != nil {
		return "", fmt.Errorf("%w: size-capped HOME: %v", ErrHostNotReady, err)
	}
	return v.Mountpoint, nil
}
