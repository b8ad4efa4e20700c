package homestore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/engine"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
)

// VolumeEngine is what the task HOME volumes ask of podman.
type VolumeEngine interface {
	engine.Volumes
	Info(ctx context.Context) (*podman.HostInfo, error)
}

// Volumes are the task HOME volumes of one shrooms state directory: a
// podman volume per task, with a size-capped filesystem (Ensure) mounted
// on its directory. Errors are fault.HostNotReady.
type Volumes struct {
	Engine VolumeEngine
	// StateDir holds the filesystem images (ImagePath).
	StateDir string
	// Prefix is home.volume_prefix; the volume is Prefix + task.
	Prefix string
	// Socket is the podman service's unix:// address, whose mount
	// namespace must see the capped filesystem too.
	Socket string
	Limits Limits
}

// Name is the task HOME volume's name.
func (v *Volumes) Name(task string) string { return v.Prefix + task }

// Image is the path of the task HOME's filesystem image.
func (v *Volumes) Image(task string) string { return ImagePath(v.StateDir, v.Name(task)) }

// serviceNamespace names the podman service's mount namespace when it is
// not shrooms' own (a service in a private namespace would otherwise give
// the cage the bare volume directory instead of the capped HOME).
func (v *Volumes) serviceNamespace() ([]string, error) {
	sock, ok := strings.CutPrefix(v.Socket, "unix://")
	if !ok {
		return nil, nil
	}
	ns, err := ServiceNamespace(sock)
	if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOENT) {
		// No service runs: no mount namespace of its holds anything.
		return nil, nil
	}
	if err != nil {
		return nil, fault.Wrapf(fault.HostNotReady, "podman service: %w", err)
	}
	return []string{ns}, nil
}

// Open makes sure task's HOME volume exists (creating it, with a new
// filesystem, when missing) and mounts its capped filesystem on it (again,
// after a reboot), so all HOME writes happen inside it. It returns the
// volume's host directory, and whether it created the volume (then a
// caller that fails afterwards undoes it with Discard).
func (v *Volumes) Open(ctx context.Context, task string) (root string, created bool, err error) {
	return v.OpenKept(ctx, task, false)
}

// OpenKept is Open for a task that may have had its HOME made already
// (kept): then drift behind shrooms' back is repaired or refused with the
// fix (drift.go) — an image deleted while attached is copied back from its
// loop device, a volume removed around a surviving image gets a new volume
// around the same image, a missing image is refused naming `shrooms
// forget`. created is true only for a new, empty HOME.
func (v *Volumes) OpenKept(ctx context.Context, task string, kept bool) (root string, created bool, err error) {
	name := v.Name(task)
	exists, err := v.Engine.VolumeExists(ctx, name)
	if err != nil {
		return "", false, fault.Wrap(fault.HostNotReady, err)
	}
	peers, err := v.serviceNamespace()
	if err != nil {
		return "", false, err
	}
	image := v.Image(task)
	if _, err := Salvage(ctx, image, peers...); err != nil {
		return "", false, fault.Wrapf(fault.HostNotReady, "%w (or `shrooms forget --task %s` discards the task's HOME)", err, task)
	}
	keep := kept && fileExists(image)
	if kept && !keep {
		return "", false, fault.Wrapf(fault.HostNotReady, "task %s's HOME image %s is gone (deleted behind shrooms' back, its credentials and sessions with it): `shrooms forget --task %s` starts the task over", task, image, task)
	}
	if exists {
		vol, err := v.Engine.InspectVolume(ctx, name)
		if err != nil {
			return "", false, fault.Wrap(fault.HostNotReady, err)
		}
		if vol.Labels[sealed.LabelTask] != task {
			return "", false, fault.Wrapf(fault.HostNotReady, "volume %s exists but is not task %s's HOME (label %s=%q); remove or rename it", name, task, sealed.LabelTask, vol.Labels[sealed.LabelTask])
		}
		root = vol.Mountpoint
	} else {
		if keep {
			// The volume went behind shrooms' back (podman volume rm, a
			// prune) and its image survives: it is still mounted where the
			// old volume was, or nowhere; a new volume gets the same image.
			if err := ReleaseImage(image, false, peers...); err != nil {
				return "", false, fault.Wrapf(fault.HostNotReady, "HOME volume %s was removed while its image was mounted: %w", name, err)
			}
		} else if err := Remove(image, "", peers...); err != nil {
			// An image without its volume, for a task that never had a
			// HOME, is a leftover: a new volume starts from a new filesystem.
			return "", false, fault.Wrapf(fault.HostNotReady, "stale HOME image: %w", err)
		}
		if root, err = v.Engine.CreateVolume(ctx, name, map[string]string{sealed.LabelManaged: "1", sealed.LabelTask: task}); err != nil {
			return "", false, fault.Wrap(fault.HostNotReady, err)
		}
		// The volume root stays root's and private; HOME lives inside it.
		if err := unix.Fchmodat(unix.AT_FDCWD, root, 0o700, 0); err != nil {
			_ = v.Engine.RemoveVolume(ctx, name)
			return "", false, fault.Wrapf(fault.HostNotReady, "HOME volume %s mode: %w", name, err)
		}
	}
	created = !exists && !keep
	if _, err := Ensure(ctx, image, root, v.Limits, peers...); err != nil {
		if created {
			v.Discard(ctx, task, root)
		}
		return "", false, fault.Wrapf(fault.HostNotReady, "size-capped HOME: %w", err)
	}
	return root, created, nil
}

// Release unmounts task's HOME filesystem, wherever it is mounted, and
// frees its loop device (an image deleted while attached is refused: the
// next Open copies it back). The caller makes sure no cage uses it.
func (v *Volumes) Release(task string) error {
	peers, err := v.serviceNamespace()
	if err != nil {
		return err
	}
	if err := ReleaseImage(v.Image(task), false, peers...); err != nil {
		return fault.Wrapf(fault.HostNotReady, "release HOME of %s: %w", task, err)
	}
	return nil
}

func fileExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// Discard undoes an Open that created the volume, best effort.
func (v *Volumes) Discard(ctx context.Context, task, root string) {
	peers, _ := v.serviceNamespace()
	_ = Remove(v.Image(task), root, peers...)
	_ = v.Engine.RemoveVolume(ctx, v.Name(task))
}

// Remove removes task's HOME: its size-capped filesystem (unmounted first)
// and its volume. Callers use it instead of removing the volume alone,
// which would leave the mount and loop device behind. A missing HOME is not
// an error.
func (v *Volumes) Remove(ctx context.Context, task string) error {
	name := v.Name(task)
	peers, err := v.serviceNamespace()
	if err != nil {
		return err
	}
	mountpoint := ""
	exists, err := v.Engine.VolumeExists(ctx, name)
	if err != nil {
		return fault.Wrap(fault.HostNotReady, err)
	}
	if exists {
		vol, err := v.Engine.InspectVolume(ctx, name)
		if err != nil {
			return fault.Wrap(fault.HostNotReady, err)
		}
		mountpoint = vol.Mountpoint
	}
	// Every mount and loop device of the image, wherever it is mounted,
	// and one whose file was deleted: the HOME goes as a whole.
	if err := ReleaseImage(v.Image(task), true, peers...); err != nil {
		return fault.Wrapf(fault.HostNotReady, "remove HOME of %s: %w", task, err)
	}
	if err := Remove(v.Image(task), mountpoint, peers...); err != nil {
		return fault.Wrapf(fault.HostNotReady, "remove HOME of %s: %w", task, err)
	}
	if exists {
		if err := v.Engine.RemoveVolume(ctx, name); err != nil {
			return fault.Wrapf(fault.HostNotReady, "remove HOME volume %s: %w", name, err)
		}
	}
	return nil
}

// Root is the host directory the task HOME volume has, or will have once
// created (for `spec`, which creates nothing).
func (v *Volumes) Root(ctx context.Context, task string) (string, error) {
	name := v.Name(task)
	exists, err := v.Engine.VolumeExists(ctx, name)
	if err != nil {
		return "", fault.Wrap(fault.HostNotReady, err)
	}
	if exists {
		vol, err := v.Engine.InspectVolume(ctx, name)
		if err != nil {
			return "", fault.Wrap(fault.HostNotReady, err)
		}
		return vol.Mountpoint, nil
	}
	info, err := v.Engine.Info(ctx)
	if err != nil {
		return "", fault.Wrap(fault.HostNotReady, err)
	}
	return filepath.Join(info.GraphRoot, "volumes", name, "_data"), nil
}

// Mounted returns the host directory of task's existing HOME with its
// size-capped filesystem mounted (mounting it, e.g. after a reboot). Code
// that touches an existing HOME outside a turn (gc's homereset.Cleanup)
// must use it: on the bare volume directory it would write where the capped
// filesystem is later mounted, which Ensure then refuses.
func (v *Volumes) Mounted(ctx context.Context, task string) (string, error) {
	name := v.Name(task)
	vol, err := v.Engine.InspectVolume(ctx, name)
	if err != nil {
		return "", fault.Wrap(fault.HostNotReady, err)
	}
	if vol.Labels[sealed.LabelTask] != task {
		return "", fault.Wrapf(fault.HostNotReady, "volume %s is not task %s's HOME", name, task)
	}
	peers, err := v.serviceNamespace()
	if err != nil {
		return "", err
	}
	if _, err := Ensure(ctx, v.Image(task), vol.Mountpoint, v.Limits, peers...); err != nil {
		return "", fault.Wrapf(fault.HostNotReady, "size-capped HOME: %w", err)
	}
	return vol.Mountpoint, nil
}

// ServiceNamespaces names the podman service's mount namespace (none when
// the service is reached over TCP): what the cage is given is what that
// namespace sees, so per-turn mounts (the outbox) are made there too.
func (v *Volumes) ServiceNamespaces() ([]string, error) { return v.serviceNamespace() }
