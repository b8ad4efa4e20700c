// Package engine is the seam between shrooms' pipeline and podman: the few
// container, volume, secret and network calls a turn and the task commands
// make, as an interface. *podman.Client is the real engine; tests may hand
// the pipeline a fake one to drive its failure paths without podman.
package engine

import (
	"context"
	"time"

	"github.com/containers/podman/v5/pkg/specgen"

	"github.com/shrooms-cage/shrooms/pkg/podman"
)

// Containers are the calls of one cage's life: create → init → start/attach
// → wait → stop → remove, and what the turn asks of a cage on the way.
type Containers interface {
	Create(ctx context.Context, s *specgen.SpecGenerator) (string, error)
	Init(ctx context.Context, id string) error
	Start(ctx context.Context, id string, st podman.Streams) (<-chan error, error)
	Wait(ctx context.Context, id string) (int32, error)
	// Follow waits for a started cage's exit from its attach stream, riding
	// through a restart of the service (re-attach, real exit code).
	Follow(ctx context.Context, id string, st podman.Streams, attached <-chan error) (int32, error)
	Stop(ctx context.Context, id string, grace time.Duration) error
	Remove(ctx context.Context, id string) error
	ExitCode(ctx context.Context, id string) (code int32, ok bool, err error)
	OOMKilled(ctx context.Context, id string) (bool, error)
	Pid(ctx context.Context, id string) (int, error)
	ListByLabel(ctx context.Context, label, value string) ([]podman.Cage, error)
	CageNamed(ctx context.Context, name string) (*podman.Cage, error)
}

// Volumes are the task HOME volume's calls.
type Volumes interface {
	VolumeExists(ctx context.Context, name string) (bool, error)
	CreateVolume(ctx context.Context, name string, labels map[string]string) (mountpoint string, err error)
	InspectVolume(ctx context.Context, name string) (*podman.Volume, error)
	RemoveVolume(ctx context.Context, name string) error
}

// Secrets hand credentials to a cage without writing them into its spec.
type Secrets interface {
	PutSecret(ctx context.Context, name string, data []byte, labels map[string]string) error
	RemoveSecret(ctx context.Context, name string) error
	// ListSecrets lists names and labels (forget and gc find a task's
	// leftover secrets by them).
	ListSecrets(ctx context.Context) ([]podman.Secret, error)
}

// Networks are the cage network's calls.
type Networks interface {
	InspectNetwork(ctx context.Context, name string) (*podman.Network, error)
	CreateNetwork(ctx context.Context, s podman.NetworkSpec) error
}

// Engine is everything the pipeline asks of podman.
type Engine interface {
	Containers
	Volumes
	Secrets
	Networks
	Info(ctx context.Context) (*podman.HostInfo, error)
	ImageExists(ctx context.Context, ref string) (bool, error)
	InspectImage(ctx context.Context, ref string) (podman.Image, error)
}

// The real engine.
var _ Engine = (*podman.Client)(nil)
