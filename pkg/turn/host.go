package turn

import (
	"context"

	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// Host is what a turn does to the host outside podman: the task HOME (its
// loop-mounted volume and the reset) and the outbox mount. The real one
// needs root; unit tests give the runner a fake (Runner.Host).
type Host interface {
	// OpenHome opens the task HOME volume, creating it when missing; kept
	// says the task had one made, so a missing part of it is drift
	// (home.Store.Open).
	OpenHome(ctx context.Context, task taskid.ID, kept bool) (root string, created bool, err error)
	// ReleaseHome unmounts the task HOME and frees its loop device.
	ReleaseHome(task taskid.ID) error
	// HomeMounted reports whether root shows the HOME filesystem of v.
	HomeMounted(v home.Volume, root string) bool
	// HomeRoot is the HOME volume's host directory, creating nothing.
	HomeRoot(ctx context.Context, v home.Volume) (string, error)
	// DiscardHome removes a HOME volume created by a turn that then failed.
	DiscardHome(ctx context.Context, v home.Volume, root string)
	Bootstrap(ctx context.Context, t home.Task) (*home.BootstrapResult, error)
	Reset(ctx context.Context, in home.ResetInput) (*home.Report, error)
	// HomeFingerprint identifies the reset HOME (home.Fingerprint;
	// "" when it changed too recently to be told apart).
	HomeFingerprint(ctx context.Context, t home.Task) (string, error)
	// Cleanup removes the old HOME trees a reset set aside.
	Cleanup(ctx context.Context, root string) error
	PlaceFile(root, rel string, data []byte, mode uint32, uid, gid int) error
	// PrepareOutbox gives the turn an empty outbox: what turn last (the
	// task's last counted turn) left is moved to its pending delivery
	// first, then a fresh size-capped tmpfs is mounted where the podman
	// service sees it. It returns the tmpfs's device.
	PrepareOutbox(ctx context.Context, root string, task taskid.ID, last, uid, gid int, lim outbox.Limits) (uint64, error)
	// SettleOutbox moves what turn left in the task's outbox to its pending
	// delivery and unmounts it (outbox.Settle; nil when it held nothing).
	SettleOutbox(ctx context.Context, root string, task taskid.ID, turn int, lim outbox.Limits) (*outbox.Moved, error)
	// OutboxReady checks the outbox is still the empty tmpfs dev a prepared
	// cage was given (outbox.Ready).
	OutboxReady(root string, task taskid.ID, uid, gid int, lim outbox.Limits, dev uint64) error
}

// host is the runner's Host: Runner.Host, or the real one.
func (r *Runner) host() Host {
	if r.Host != nil {
		return r.Host
	}
	return realHost{r.homes()}
}

// realHost is Host on the real HOMEs (pkg/home) and outbox.
type realHost struct{ v *home.Store }

func (h realHost) OpenHome(ctx context.Context, task taskid.ID, kept bool) (string, bool, error) {
	o, err := h.v.Open(ctx, task, kept)
	if err != nil {
		return "", false, err
	}
	return o.Root, o.Created, nil
}

func (h realHost) ReleaseHome(task taskid.ID) error { return h.v.Release(task) }

func (h realHost) HomeMounted(v home.Volume, root string) bool { return h.v.IsMounted(v, root) }

func (h realHost) HomeRoot(ctx context.Context, v home.Volume) (string, error) {
	return h.v.Root(ctx, v)
}

func (h realHost) DiscardHome(ctx context.Context, v home.Volume, root string) {
	h.v.Discard(ctx, v, root)
}

func (realHost) Bootstrap(ctx context.Context, t home.Task) (*home.BootstrapResult, error) {
	return home.Bootstrap(ctx, t)
}

func (realHost) Reset(ctx context.Context, in home.ResetInput) (*home.Report, error) {
	return home.Reset(ctx, in)
}

func (realHost) HomeFingerprint(ctx context.Context, t home.Task) (string, error) {
	return home.Fingerprint(ctx, t)
}

func (realHost) Cleanup(ctx context.Context, root string) error {
	_, err := home.Cleanup(ctx, root)
	return err
}

func (realHost) PlaceFile(root, rel string, data []byte, mode uint32, uid, gid int) error {
	return home.PlaceFile(root, rel, data, mode, uid, gid)
}

func (h realHost) PrepareOutbox(ctx context.Context, root string, task taskid.ID, last, uid, gid int, lim outbox.Limits) (uint64, error) {
	peers, err := h.v.ServiceNamespaces()
	if err != nil {
		return 0, err
	}
	if _, err := outbox.Settle(ctx, root, task, last, lim, peers...); err != nil {
		return 0, err
	}
	ns := ""
	if len(peers) > 0 {
		ns = peers[0]
	}
	return outbox.Mount(root, task, uid, gid, lim, ns)
}

func (h realHost) SettleOutbox(ctx context.Context, root string, task taskid.ID, turn int, lim outbox.Limits) (*outbox.Moved, error) {
	peers, err := h.v.ServiceNamespaces()
	if err != nil {
		return nil, err
	}
	return outbox.Settle(ctx, root, task, turn, lim, peers...)
}

func (h realHost) OutboxReady(root string, task taskid.ID, uid, gid int, lim outbox.Limits, dev uint64) error {
	peers, err := h.v.ServiceNamespaces()
	if err != nil {
		return err
	}
	ns := ""
	if len(peers) > 0 {
		ns = peers[0]
	}
	return outbox.Ready(root, task, uid, gid, lim, ns, dev)
}
