package turn

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/homereset"
	"github.com/shrooms-cage/shrooms/pkg/homestore"
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
	// Drift behind shrooms' back is repaired here or refused with the fix
	// (homestore/drift.go): an image deleted while attached is copied back
	// from its loop device; a volume removed around a surviving image gets
	// a new volume around the same image.
	hadHome, err := r.Store.Recall(task, taskstate.FactHome)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %v", ErrHostNotReady, err)
	}
	if n, _ := r.Store.LastTurn(task); n > 0 && hadHome == "" {
		hadHome = name // a task from before the fact was kept
	}
	if _, err := homestore.Salvage(ctx, image, peers...); err != nil {
		return "", nil, fmt.Errorf("%w: %v (or `shrooms forget --task %s` discards the task's HOME)", ErrHostNotReady, err, task)
	}
	keep := hadHome != "" && fileExists(image)
	if hadHome != "" && !keep {
		return "", nil, fmt.Errorf("%w: task %s's HOME image %s is gone (deleted behind shrooms' back, its credentials and sessions with it): `shrooms forget --task %s` starts the task over", ErrHostNotReady, task, image, task)
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
		if keep {
			// The volume went behind shrooms' back (podman volume rm, a
			// prune) and its image survives: it is still mounted where the
			// old volume was, or nowhere; a new volume gets the same image.
			if err := homestore.ReleaseImage(image, false, peers...); err != nil {
				return "", nil, fmt.Errorf("%w: HOME volume %s was removed while its image was mounted: %v", ErrHostNotReady, name, err)
			}
		} else if err := homestore.Remove(image, "", peers...); err != nil {
			// An image without its volume, for a task that never had a
			// HOME, is a leftover: a new volume starts from a new filesystem.
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
	// A new HOME that fails half-way goes again; one with kept state never.
	undo := func() {
		if !exists && !keep {
			_ = homestore.Remove(image, root, peers...)
			_ = r.Podman.RemoveVolume(ctx, name)
		}
	}
	// Every turn: the capped filesystem is mounted on the volume (again,
	// after a reboot), so all HOME writes, and the reset, happen inside it.
	lim := homestore.Limits{Size: int64(r.Cfg.Home.Size), Inodes: r.Cfg.Home.Inodes}
	if _, err := homestore.Ensure(ctx, image, root, lim, peers...); err != nil {
		undo()
		return "", nil, fmt.Errorf("%w: size-capped HOME: %v", ErrHostNotReady, err)
	}
	res, err := homereset.Bootstrap(ctx, r.homeTask(root, ids, profiles))
	if err != nil {
		undo()
		return "", nil, fmt.Errorf("%w: bootstrap HOME: %v", ErrHostNotReady, err)
	}
	if hadHome == "" {
		if err := r.Store.Remember(task, taskstate.FactHome, name); err != nil {
			return "", nil, fmt.Errorf("%w: %v", ErrHostNotReady, err)
		}
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
	image := homestore.ImagePath(r.Cfg.State.Dir, name)
	// Every mount and loop device of the image, wherever it is mounted,
	// and one whose file was deleted: the HOME goes as a whole.
	if err := homestore.ReleaseImage(image, true, peers...); err != nil {
		return fmt.Errorf("%w: remove HOME of %s: %v", ErrHostNotReady, task, err)
	}
	if err := homestore.Remove(image, mountpoint, peers...); err != nil {
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

func fileExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// ReleaseHome unmounts task's HOME filesystem and frees its loop device
// when no cage of the task is left (a prepared one waiting on it, or one
// whose removal failed): HOME is mounted for the
// reset and the turn only, so nothing holds a loop device between turns
// and a `podman volume rm` between turns cannot reach into HOME. Call it
// with the task lock held. An unknown podman state keeps the mount.
func (r *Runner) ReleaseHome(ctx context.Context, task string) error {
	if busy, err := r.homeInUse(ctx, task); err != nil || busy {
		return err
	}
	peers, err := r.podmanNamespace()
	if err != nil {
		return err
	}
	if err := homestore.ReleaseImage(homestore.ImagePath(r.Cfg.State.Dir, r.VolumeName(task)), false, peers...); err != nil {
		return fmt.Errorf("%w: release HOME of %s: %v", ErrHostNotReady, task, err)
	}
	return nil
}

// homeInUse reports whether any cage of task exists (whatever its state):
// its HOME must stay mounted for it.
func (r *Runner) homeInUse(ctx context.Context, task string) (bool, error) {
	cages, err := r.Podman.ListByLabel(ctx, sealed.LabelTask, task)
	if err != nil {
		return false, fmt.Errorf("%w: %v", ErrHostNotReady, err)
	}
	for _, c := range cages {
		if r.ours(c) {
			return true, nil
		}
	}
	return false, nil
}
