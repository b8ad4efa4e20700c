package home

import (
	"context"
	"errors"
	"fmt"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/engine"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/homestore"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
)

// Engine is what the task HOME volumes ask of podman.
type Engine interface {
	engine.Volumes
	Info(ctx context.Context) (*podman.HostInfo, error)
}

// Store is the task HOMEs of one shrooms state directory: a podman volume
// per task, with a size-capped filesystem (homestore.Ensure) mounted on its
// directory. Errors are fault.HostNotReady.
type Store struct {
	Engine Engine
	// StateDir holds the filesystem images (homestore.ImagePath).
	StateDir string
	// Prefix is home.volume_prefix; the volume is Prefix + task.
	Prefix string
	// Socket is the podman service's unix:// address, whose mount
	// namespace must see the capped filesystem too.
	Socket string
	Limits homestore.Limits
}

// Name is the task HOME volume's name.
func (s *Store) Name(task taskid.ID) string { return s.Volume(task).Name }

// Image is the path of the task HOME's filesystem image.
func (s *Store) Image(task taskid.ID) string { return s.Volume(task).Image }

// Volume names one task's HOME volume and its filesystem image, derived
// once from the task id: what only finds, checks or removes them (Root,
// IsMounted, Discard) needs these names, not the id.
type Volume struct {
	// Name is the podman volume's (Store.Name), Image the path of its
	// filesystem image (Store.Image).
	Name, Image string
}

// Volume is task's HOME volume and image names: the one place they are
// derived from the id (Name and Image are its fields).
func (s *Store) Volume(task taskid.ID) Volume {
	n := s.Prefix + task.String()
	return Volume{Name: n, Image: homestore.ImagePath(s.StateDir, n)}
}

// serviceNamespace names the podman service's mount namespace when it is
// not shrooms' own (a service in a private namespace would otherwise give
// the cage the bare volume directory instead of the capped HOME).
func (s *Store) serviceNamespace() ([]string, error) {
	sock, ok := strings.CutPrefix(s.Socket, "unix://")
	if !ok {
		return nil, nil
	}
	ns, err := homestore.ServiceNamespace(sock)
	if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOENT) {
		// No service runs: no mount namespace of its holds anything.
		return nil, nil
	}
	if err != nil {
		return nil, fault.Wrapf(fault.HostNotReady, "podman service: %w", err)
	}
	return []string{ns}, nil
}

// Open opens task's HOME: it makes sure its volume exists (creating it,
// with a new filesystem, when missing) and mounts its capped filesystem on
// it (again, after a reboot), so all HOME writes happen inside it. The
// Home has the volume's host directory and says whether this Open created
// the volume (then a caller that fails afterwards undoes it with
// Home.Discard; Created is true only for a new, empty HOME). kept says
// the task may have had its HOME made already: then drift behind shrooms'
// back is repaired or refused with the fix (drift.go) — an image deleted
// while attached is copied back from its loop device, a volume removed
// around a surviving image gets a new volume around the same image, a
// missing image is refused naming `shrooms forget`.
func (s *Store) Open(ctx context.Context, task taskid.ID, kept bool) (*Home, error) {
	v := s.Volume(task)
	root := ""
	name := v.Name
	// An existing volume (every turn but a task's first) in one round trip
	// to podman, as in Root; whether it exists is asked only when that fails.
	vol, ierr := s.Engine.InspectVolume(ctx, name)
	exists := ierr == nil && vol != nil
	if !exists {
		there, err := s.Engine.VolumeExists(ctx, name)
		if err != nil {
			return nil, fault.Wrap(fault.HostNotReady, err)
		}
		if there {
			if ierr == nil {
				ierr = fmt.Errorf("inspect volume %s: podman says nothing of it", name)
			}
			return nil, fault.Wrap(fault.HostNotReady, ierr)
		}
	}
	peers, err := s.serviceNamespace()
	if err != nil {
		return nil, err
	}
	image := v.Image
	if _, err := homestore.Salvage(ctx, image, peers...); err != nil {
		return nil, fault.Wrapf(fault.HostNotReady, "%w (or `shrooms forget --task %s` discards the task's HOME)", err, task)
	}
	keep := kept && fileExists(image)
	if kept && !keep {
		return nil, fault.Wrapf(fault.HostNotReady, "task %s's HOME image %s is gone (deleted behind shrooms' back, its credentials and sessions with it): `shrooms forget --task %s` starts the task over", task, image, task)
	}
	if exists {
		if vol.Labels[sealed.LabelTask] != task.String() {
			return nil, fault.Wrapf(fault.HostNotReady, "volume %s exists but is not task %s's HOME (label %s=%q); remove or rename it", name, task, sealed.LabelTask, vol.Labels[sealed.LabelTask])
		}
		root = vol.Mountpoint
	} else {
		if keep {
			// The volume went behind shrooms' back (podman volume rm, a
			// prune) and its image survives: it is still mounted where the
			// old volume was, or nowhere; a new volume gets the same image.
			if err := homestore.ReleaseImage(image, false, peers...); err != nil {
				return nil, fault.Wrapf(fault.HostNotReady, "HOME volume %s was removed while its image was mounted: %w", name, err)
			}
		} else if err := homestore.Remove(image, "", peers...); err != nil {
			// An image without its volume, for a task that never had a
			// HOME, is a leftover: a new volume starts from a new filesystem.
			return nil, fault.Wrapf(fault.HostNotReady, "stale HOME image: %w", err)
		}
		if root, err = s.Engine.CreateVolume(ctx, name, map[string]string{sealed.LabelManaged: "1", sealed.LabelTask: task.String()}); err != nil {
			return nil, fault.Wrap(fault.HostNotReady, err)
		}
		// The volume root stays root's and private; HOME lives inside it.
		if err := unix.Fchmodat(unix.AT_FDCWD, root, 0o700, 0); err != nil {
			_ = s.Engine.RemoveVolume(ctx, name)
			return nil, fault.Wrapf(fault.HostNotReady, "HOME volume %s mode: %w", name, err)
		}
	}
	created := !exists && !keep
	if _, err := homestore.Ensure(ctx, image, root, s.Limits, peers...); err != nil {
		if created {
			s.Discard(ctx, v, root)
		}
		return nil, fault.Wrapf(fault.HostNotReady, "size-capped HOME: %w", err)
	}
	return &Home{Root: root, Created: created, task: task, store: s}, nil
}

// Release unmounts task's HOME filesystem, wherever it is mounted, and
// frees its loop device (an image deleted while attached is refused: the
// next Open copies it back). The caller makes sure no cage uses it.
func (s *Store) Release(task taskid.ID) error {
	peers, err := s.serviceNamespace()
	if err != nil {
		return err
	}
	if err := homestore.ReleaseImage(s.Image(task), false, peers...); err != nil {
		return fault.Wrapf(fault.HostNotReady, "release HOME of %s: %w", task, err)
	}
	return nil
}

func fileExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// Discard undoes an Open that created the volume v, best effort.
func (s *Store) Discard(ctx context.Context, v Volume, root string) {
	peers, _ := s.serviceNamespace()
	_ = homestore.Remove(v.Image, root, peers...)
	_ = s.Engine.RemoveVolume(ctx, v.Name)
}

// Remove removes task's HOME: its size-capped filesystem (unmounted first)
// and its volume. Callers use it instead of removing the volume alone,
// which would leave the mount and loop device behind. A missing HOME is not
// an error.
func (s *Store) Remove(ctx context.Context, task taskid.ID) error {
	name := s.Name(task)
	peers, err := s.serviceNamespace()
	if err != nil {
		return err
	}
	mountpoint := ""
	exists, err := s.Engine.VolumeExists(ctx, name)
	if err != nil {
		return fault.Wrap(fault.HostNotReady, err)
	}
	if exists {
		vol, err := s.Engine.InspectVolume(ctx, name)
		if err != nil {
			return fault.Wrap(fault.HostNotReady, err)
		}
		mountpoint = vol.Mountpoint
	}
	// Every mount and loop device of the image, wherever it is mounted,
	// and one whose file was deleted: the HOME goes as a whole.
	if err := homestore.ReleaseImage(s.Image(task), true, peers...); err != nil {
		return fault.Wrapf(fault.HostNotReady, "remove HOME of %s: %w", task, err)
	}
	if err := homestore.Remove(s.Image(task), mountpoint, peers...); err != nil {
		return fault.Wrapf(fault.HostNotReady, "remove HOME of %s: %w", task, err)
	}
	if exists {
		if err := s.Engine.RemoveVolume(ctx, name); err != nil {
			return fault.Wrapf(fault.HostNotReady, "remove HOME volume %s: %w", name, err)
		}
	}
	return nil
}

// Root is the host directory the task HOME volume v has, or will have once
// created (for `spec`, which creates nothing).
func (s *Store) Root(ctx context.Context, v Volume) (string, error) {
	name := v.Name
	// An existing volume (every turn but a task's first) in one round trip
	// to podman; whether it exists is asked only when that fails.
	vol, err := s.Engine.InspectVolume(ctx, name)
	if err == nil && vol != nil {
		return vol.Mountpoint, nil
	}
	exists, xerr := s.Engine.VolumeExists(ctx, name)
	if xerr != nil {
		return "", fault.Wrap(fault.HostNotReady, xerr)
	}
	if exists && err == nil {
		return "", fault.Wrapf(fault.HostNotReady, "inspect volume %s: podman says nothing of it", name)
	}
	if exists {
		return "", fault.Wrap(fault.HostNotReady, err)
	}
	info, err := s.Engine.Info(ctx)
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
func (s *Store) Mounted(ctx context.Context, task taskid.ID) (string, error) {
	name := s.Name(task)
	vol, err := s.Engine.InspectVolume(ctx, name)
	if err != nil {
		return "", fault.Wrap(fault.HostNotReady, err)
	}
	if vol.Labels[sealed.LabelTask] != task.String() {
		return "", fault.Wrapf(fault.HostNotReady, "volume %s is not task %s's HOME", name, task)
	}
	peers, err := s.serviceNamespace()
	if err != nil {
		return "", err
	}
	if _, err := homestore.Ensure(ctx, s.Image(task), vol.Mountpoint, s.Limits, peers...); err != nil {
		return "", fault.Wrapf(fault.HostNotReady, "size-capped HOME: %w", err)
	}
	return vol.Mountpoint, nil
}

// ServiceNamespaces names the podman service's mount namespace (none when
// the service is reached over TCP): what the cage is given is what that
// namespace sees, so per-turn mounts (the outbox) are made there too.
func (s *Store) ServiceNamespaces() ([]string, error) { return s.serviceNamespace() }
