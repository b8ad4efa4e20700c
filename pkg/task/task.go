// Package task holds the task commands, the layer above the turn pipeline:
// what the CLI does to a task between turns — collect and list its outbox,
// commit and trust its worktree, reset and forget it, gc the cages a crash
// left, and read its log, status and lock holder (stop). It builds on
// pkg/turn's Runner; pkg/turn never imports it.
package task

import "github.com/shrooms-cage/shrooms/pkg/turn"

// Commands are the task commands on one runner (its config, engine and
// state directory).
type Commands struct {
	*turn.Runner
}

// New returns the task commands of r.
func New(r *turn.Runner) *Commands { return &Commands{Runner: r} }
