// Package task holds the task commands, beside the turn pipeline: what the
// CLI does to a task between turns — collect and list its outbox, commit
// and trust its worktree, reset and forget it, gc the cages a crash left,
// and read its log, status and lock holder (stop). It holds what it uses
// (config, engine, task state, the HOMEs, the worktree claims) and asks
// the pipeline only for what a turn leaves behind (Pipeline); pkg/turn
// never imports it.
package task

import (
	"context"
	"path/filepath"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/engine"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/worktree"
	"github.com/shrooms-cage/shrooms/pkg/worktree/guard"
)

// Commands are the task commands on one config, engine and state
// directory.
type Commands struct {
	Cfg *config.Config
	// Podman is the container engine; nil for the commands that never
	// contact podman (those of the state directory, the outbox and the
	// worktree).
	Podman  engine.Engine
	Store   taskstate.Store
	IDFiles taskstate.IDFiles
	Homes   *home.Store
	Layout  taskstate.Layout
	// Worktrees are the worktree claims (pkg/worktree): their give-back
	// and release.
	Worktrees worktree.Claims
	// Turns is the turn pipeline's side of a task between turns.
	Turns Pipeline
}

// Pipeline is what the task commands ask of the turn pipeline (the turn
// runner): its cages, and the HOME and outbox a turn leaves mounted.
type Pipeline interface {
	// RemoveLeftovers removes the task's cages a crashed shrooms left.
	RemoveLeftovers(ctx context.Context, task taskid.ID, keep ...string) ([]string, error)
	// HomeInUse reports whether any cage of task exists.
	HomeInUse(ctx context.Context, task taskid.ID) (bool, error)
	// ReleaseHome unmounts task's HOME when no cage of it is left.
	ReleaseHome(ctx context.Context, task taskid.ID) error
	// SettleOutbox moves what the last turn left in the outbox to its
	// pending delivery.
	SettleOutbox(ctx context.Context, task taskid.ID) (*outbox.Moved, error)
}

// New returns the task commands of cfg on eng (nil: no podman), beside the
// pipeline turns of the same config.
func New(cfg *config.Config, eng engine.Engine, turns Pipeline) *Commands {
	r := state(cfg)
	r.Podman = eng
	r.Homes = home.NewStore(eng, cfg)
	r.Turns = turns
	return r
}

// state is the commands that read the state directory only.
func state(cfg *config.Config) *Commands {
	return &Commands{
		Cfg:       cfg,
		Store:     taskstate.Store{Dir: cfg.State.Dir},
		IDFiles:   taskstate.DefaultIDFiles(cfg.Cage.SubIDUser),
		Homes:     home.NewStore(nil, cfg),
		Layout:    taskstate.Layout{Dir: cfg.State.Dir},
		Worktrees: worktree.NewClaims(cfg),
	}
}

// ours reports whether a cage was made by a shrooms with this state dir.
func (r *Commands) ours(c podman.Cage) bool { return sealed.Ours(r.Cfg.State.Dir, c.Labels) }

// trustStore is the task's store of trusted worktree config.
func (r *Commands) trustStore(task taskid.ID) guard.Store {
	return guard.Store{Dir: filepath.Join(r.taskDir(task), "trust")}
}

// taskDir is the state directory of task.
func (r *Commands) taskDir(task taskid.ID) string {
	return filepath.Join(r.Layout.Tasks(), task.String())
}

// managedCages lists every cage shrooms manages on the engine (its
// callers' phases, gc and ExpirePrepared, kind a failure).
func (r *Commands) managedCages(ctx context.Context) ([]podman.Cage, error) {
	return r.Podman.ListByLabel(ctx, sealed.LabelManaged, "1")
}
