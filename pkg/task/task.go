// Package task holds the task commands, beside the turn pipeline: what the
// CLI does to a task between turns — collect and list its outbox, commit
// and trust its worktree, reset and forget it, gc the cages a crash left,
// and read its log, status and lock holder (stop). It holds what it uses
// (config, engine, task state, the HOMEs, the cages, the worktree claims);
// pkg/turn never imports it, and it asks the turn pipeline nothing.
package task

import (
	"context"
	"path/filepath"

	"github.com/shrooms-cage/shrooms/pkg/cages"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/engine"
	"github.com/shrooms-cage/shrooms/pkg/fault"
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
	// Podman is the container engine; the commands that may not need it
	// (those of the state directory, the outbox and the worktree) are
	// given one that connects on its first use (podman.Lazy).
	Podman  engine.Engine
	Store   taskstate.Store
	IDFiles taskstate.IDFiles
	Homes   *home.Store
	Layout  taskstate.Layout
	// Worktrees are the worktree claims (pkg/worktree): their give-back
	// and release.
	Worktrees worktree.Claims
}

// New returns the task commands of cfg on eng (nil: no podman).
func New(cfg *config.Config, eng engine.Engine) *Commands {
	r := state(cfg)
	r.Podman = eng
	r.Homes = home.NewStore(eng, cfg)
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

// cages are the cages of this state directory on the engine (those a
// turn left: leftovers, or a prepared one holding the HOME).
func (r *Commands) cages() cages.Cages {
	return cages.Cages{Engine: r.Podman, StateDir: r.Cfg.State.Dir}
}

// ours reports whether a cage was made by a shrooms with this state dir.
func (r *Commands) ours(c podman.Cage) bool { return r.cages().Ours(c) }

// releaseHome unmounts task's HOME and frees its loop device when no cage
// of the task is left (one prepared ahead waits on it). Call it with the
// task lock held; an unknown podman state keeps the mount.
func (r *Commands) releaseHome(ctx context.Context, task taskid.ID) error {
	if busy, err := r.cages().InUse(ctx, task); err != nil || busy {
		return err
	}
	return r.Homes.Release(task)
}

// settleOutbox moves what task's last turn left in its outbox to its
// pending delivery (outbox.Settle; nil when it held nothing). Call it with
// the task lock held and no cage of the task running.
func (r *Commands) settleOutbox(ctx context.Context, task taskid.ID) (_ *outbox.Moved, err error) {
	defer fault.Phase(fault.HostNotReady, &err)
	last, err := r.Store.LastTurn(task)
	if err != nil {
		return nil, err
	}
	peers, err := r.Homes.ServiceNamespaces()
	if err != nil {
		return nil, err
	}
	return outbox.Settle(ctx, r.Cfg.Outbox.Root, task, last, outbox.LimitsFrom(r.Cfg.Outbox), peers...)
}

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
