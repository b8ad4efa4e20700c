// Package home is the task HOME's one door: its volume (a podman volume
// around a size-capped filesystem image, pkg/homestore) and what is done
// inside it (bootstrap once, reset before every turn, cleanup after,
// pkg/homereset), and the managed policy the cage mounts read-only outside
// it (policy.go). The pipeline, the task commands and the CLI use this
// package only; homestore and homereset are its lower half.
package home

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/homereset"
	"github.com/shrooms-cage/shrooms/pkg/homestore"
	"github.com/shrooms-cage/shrooms/pkg/profile"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// The lower half's types and results, named here so that callers need no
// other door.
type (
	// Task describes one task HOME to the reset (homereset.Task).
	Task = homereset.Task
	// ResetInput is what one reset is asked to do.
	ResetInput = homereset.ResetInput
	// Report is what a reset did (or, dry, would do).
	Report = homereset.Report
	// BootstrapResult is what a bootstrap did.
	BootstrapResult = homereset.BootstrapResult
	// PolicyGateway is what the managed policy must pin when the turn's
	// model requests go through shrooms' gateway.
	PolicyGateway = profile.Gateway
	// Attachment is one loop device of a HOME image and its mounts.
	Attachment = homestore.Attachment
)

// Bootstrap results.
const (
	Bootstrapped        = homereset.Bootstrapped
	AlreadyBootstrapped = homereset.AlreadyBootstrapped
)

// NewStore is the task HOMEs of cfg on eng (nil for a Store that only names
// volumes and images).
func NewStore(eng Engine, cfg *config.Config) *Store {
	return &Store{
		Engine:   eng,
		StateDir: cfg.State.Dir,
		Prefix:   cfg.Home.VolumePrefix,
		Socket:   cfg.Podman.Socket,
		Limits:   homestore.Limits{Size: int64(cfg.Home.Size), Inodes: cfg.Home.Inodes},
	}
}

// Home is one task's HOME, open: its volume's host directory with the
// capped filesystem mounted on it.
type Home struct {
	// Root is the volume's host directory (homereset.Task.Root).
	Root string
	// Created says this Open made the volume: a caller that fails before
	// the HOME is bootstrapped undoes it with Discard.
	Created bool
	task    taskid.ID
	store   *Store
}

// Bootstrap seeds the HOME's credentials once (t.Root is the HOME's).
func (h *Home) Bootstrap(ctx context.Context, t Task) (*BootstrapResult, error) {
	t.Root = h.Root
	return homereset.Bootstrap(ctx, t)
}

// Reset rebuilds the HOME from its keep-list and the baseline.
func (h *Home) Reset(ctx context.Context, in ResetInput) (*Report, error) {
	in.Task.Root = h.Root
	return homereset.Reset(ctx, in)
}

// Cleanup removes the old HOME trees resets set aside; it returns how many.
func (h *Home) Cleanup(ctx context.Context) (int, error) { return Cleanup(ctx, h.Root) }

// Release unmounts the HOME and frees its loop device.
func (h *Home) Release() error { return h.store.Release(h.task) }

// Discard removes the HOME when this Open created it, best effort.
func (h *Home) Discard(ctx context.Context) {
	if h.Created {
		h.store.Discard(ctx, h.store.Volume(h.task), h.Root)
	}
}

// Bytes is the disk space the HOME's filesystem image takes.
func (h *Home) Bytes() int64 { return h.store.Bytes(h.task) }

// IsMounted reports whether root shows the HOME filesystem of v.
func (s *Store) IsMounted(v Volume, root string) bool {
	return homestore.IsMounted(v.Image, root)
}

// Bytes is the disk space task's HOME image takes (0 when there is none).
func (s *Store) Bytes(task taskid.ID) int64 {
	var fs unix.Stat_t
	if unix.Lstat(s.Image(task), &fs) != nil {
		return 0
	}
	return fs.Blocks * 512
}

// Attachments lists the loop devices of every HOME image of the store.
func (s *Store) Attachments() ([]Attachment, error) {
	return homestore.Attachments(taskstate.Layout{Dir: s.StateDir}.Homes())
}

// AttachmentsOf lists the loop devices of task's HOME image.
func (s *Store) AttachmentsOf(task taskid.ID) ([]Attachment, error) {
	atts, err := s.Attachments()
	return homestore.Of(atts, s.Image(task)), err
}

// LetGo releases a of a forgotten task: nothing of it is kept.
func LetGo(a Attachment) error { return homestore.Release([]Attachment{a}) }

// Salvage copies a deleted image back from its loop device.
func Salvage(ctx context.Context, a Attachment) error {
	_, err := homestore.Salvage(ctx, a.Image)
	return err
}

// ReleaseImage unmounts a's image wherever it is mounted and frees its
// loop devices, keeping the image.
func ReleaseImage(a Attachment) error { return homestore.ReleaseImage(a.Image, false) }

// Cleanup removes the old HOME trees resets set aside under root (a HOME's
// volume directory, mounted); it returns how many.
func Cleanup(ctx context.Context, root string) (int, error) {
	rep, err := homereset.Cleanup(ctx, root)
	if err != nil {
		return 0, err
	}
	return len(rep.Trees), nil
}

// Bootstrap, Reset and Fingerprint on a HOME given by its Task (the seam
// pkg/turn's unit tests replace calls these).
func Bootstrap(ctx context.Context, t Task) (*BootstrapResult, error) {
	return homereset.Bootstrap(ctx, t)
}

// Reset rebuilds the HOME of in.Task from its keep-list and the baseline.
func Reset(ctx context.Context, in ResetInput) (*Report, error) { return homereset.Reset(ctx, in) }

// Fingerprint identifies a reset HOME ("" when it changed too recently to
// be told apart).
func Fingerprint(ctx context.Context, t Task) (string, error) { return homereset.Fingerprint(ctx, t) }

// ResetDir is a whole turn's HOME work on a plain directory (the kube init
// container's volume, no capped filesystem): bootstrap, reset, cleanup.
func ResetDir(ctx context.Context, t Task) (*Report, error) {
	if _, err := homereset.Bootstrap(ctx, t); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	rep, err := homereset.Reset(ctx, ResetInput{Task: t})
	if err != nil {
		return nil, fmt.Errorf("HOME reset failed, the turn does not start: %w", err)
	}
	if _, err := homereset.Cleanup(ctx, t.Root); err != nil {
		return nil, fmt.Errorf("cleanup: %w", err)
	}
	return rep, nil
}

// Dir is the live HOME inside a volume directory root.
func Dir(root string) string { return homereset.HomeDir(root) }

// PlaceFile writes one file into the HOME under root, fd-relative.
func PlaceFile(root, rel string, data []byte, mode uint32, uid, gid int) error {
	return homereset.PlaceFile(root, rel, data, mode, uid, gid)
}

// CheckBaseline refuses a baseline the profiles' keep-lists would carry or
// lie over.
func CheckBaseline(cfg *config.Config, profiles []string) error {
	return homereset.CheckBaseline(cfg, profiles)
}
