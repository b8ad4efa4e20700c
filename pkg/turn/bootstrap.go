package turn

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// Bootstrap outcomes.
const (
	Bootstrapped        = "bootstrapped"
	AlreadyBootstrapped = "already-bootstrapped"
)

// Bootstrap creates the task HOME volume once, owned by the agent's host ids.
// On a volume that exists it returns AlreadyBootstrapped and changes nothing.
func Bootstrap(ctx context.Context, cfg *config.Config, client *podman.Client, task string, ids taskstate.IDs) (string, error) {
	name := cfg.Home.VolumePrefix + task
	exists, err := client.VolumeExists(ctx, name)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrHostNotReady, err)
	}
	if exists {
		return AlreadyBootstrapped, nil
	}
	mountpoint, err := client.CreateVolume(ctx, name, map[string]string{sealed.LabelManaged: "1", sealed.LabelTask: task})
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrHostNotReady, err)
	}
	// A fresh volume is root's; hand its root to the agent's host ids. Nothing
	// of the cage's is in it yet, so a plain path is safe, but never follow.
	uid, gid := int(ids.UID)+int(cfg.Cage.User), int(ids.GID)+int(cfg.Cage.User)
	if err := unix.Fchownat(unix.AT_FDCWD, mountpoint, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		_ = client.RemoveVolume(ctx, name)
		return "", fmt.Errorf("%w: own HOME volume %s: %v", ErrHostNotReady, name, err)
	}
	if err := os.Chmod(mountpoint, 0o700); err != nil {
		_ = client.RemoveVolume(ctx, name)
		return "", fmt.Errorf("%w: HOME volume %s mode: %v", ErrHostNotReady, name, err)
	}
	return Bootstrapped, nil
}
