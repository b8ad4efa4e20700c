package turn

import (
	"context"

	"github.com/shrooms-cage/shrooms/pkg/homereset"
	"github.com/shrooms-cage/shrooms/pkg/homestore"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
)

// Host is what a turn does to the host outside podman: the task HOME (its
// loop-mounted volume and the reset) and the outbox mount. The real one
// needs root; unit tests give the runner a fake (Runner.Host).
type Host interface {
	// OpenHome opens the task HOME volume, creating it when missing.
	OpenHome(ctx context.Context, task string) (root string, created bool, err error)
	// HomeRoot is the HOME volume's host directory, creating nothing.
	HomeRoot(ctx context.Context, task string) (string, error)
	// DiscardHome removes a HOME volume created by a turn that then failed.
	DiscardHome(ctx context.Context, task, root string)
	Bootstrap(ctx context.Context, t homereset.Task) (*homereset.BootstrapResult, error)
	Reset(ctx context.Context, in homereset.ResetInput) (*homereset.Report, error)
	// Cleanup removes the old HOME trees a reset set aside.
	Cleanup(ctx context.Context, root string) error
	PlaceFile(root, rel string, data []byte, mode uint32, uid, gid int) error
	// PrepareOutbox mounts the task's size-capped outbox and returns it.
	PrepareOutbox(root, task string, uid, gid int, lim outbox.Limits) (string, error)
}

// host is the runner's Host: Runner.Host, or the real one.
func (r *Runner) host() Host {
	if r.Host != nil {
		return r.Host
	}
	return realHost{r.Home()}
}

// realHost is Host on the real HOME volumes, homereset and outbox.
type realHost struct{ v *homestore.Volumes }

func (h realHost) OpenHome(ctx context.Context, task string) (string, bool, error) {
	return h.v.Open(ctx, task)
}

func (h realHost) HomeRoot(ctx context.Context, task string) (string, error) {
	return h.v.Root(ctx, task)
}

func (h realHost) DiscardHome(ctx context.Context, task, root string) { h.v.Discard(ctx, task, root) }

func (realHost) Bootstrap(ctx context.Context, t homereset.Task) (*homereset.BootstrapResult, error) {
	return homereset.Bootstrap(ctx, t)
}

func (realHost) Reset(ctx context.Context, in homereset.ResetInput) (*homereset.Report, error) {
	return homereset.Reset(ctx, in)
}

func (realHost) Cleanup(ctx context.Context, root string) error {
	_, err := homereset.Cleanup(ctx, root)
	return err
}

func (realHost) PlaceFile(root, rel string, data []byte, mode uint32, uid, gid int) error {
	return homereset.PlaceFile(root, rel, data, mode, uid, gid)
}

func (realHost) PrepareOutbox(root, task string, uid, gid int, lim outbox.Limits) (string, error) {
	return outbox.Prepare(root, task, uid, gid, lim)
}
