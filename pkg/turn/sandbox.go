package turn

import (
	"context"
	"fmt"

	"github.com/shrooms-cage/shrooms/pkg/runsc"
)

// checkSandbox refuses a gVisor cage whose runsc ignores its seccomp
// profile. The cage is initialised (runsc has booted its sandbox, nothing
// of the agent runs yet), and the flags are read from the sandbox
// process's own command line: what runsc really runs with, whether podman
// gave them (--runtime-flag) or a wrapper did. A sandbox this host cannot
// see (a podman service elsewhere) is refused too: its flags cannot be
// checked (docs/gvisor.md).
func (r *Runner) checkSandbox(ctx context.Context, id string) error {
	pid, err := r.Podman.Pid(ctx, id)
	if err != nil {
		return fmt.Errorf("%w: cage.runtime %s: %w", ErrHostNotReady, r.Cfg.Cage.Runtime, err)
	}
	flags, err := runsc.Sandbox(pid, id)
	if err != nil {
		return fmt.Errorf("%w: cage.runtime %s: %w: its --oci-seccomp cannot be checked (is the podman service on another host?)", ErrHostNotReady, r.Cfg.Cage.Runtime, err)
	}
	if fail, _ := runsc.Judge(flags); fail != "" {
		return fmt.Errorf("%w: cage %.12s: %s; start the podman service with --runtime-flag oci-seccomp (docs/gvisor.md)", ErrHostNotReady, id, fail)
	}
	return nil
}
