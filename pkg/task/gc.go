package task

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/homereset"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// GCReport lists what gc did.
type GCReport struct {
	Removed []string `json:"removed"`
	Busy    []string `json:"busy"`
	// HomeTrees counts old HOME trees deleted (left by interrupted cleanups).
	HomeTrees int `json:"homeTrees"`
	// Worktrees lists worktrees given back to their owners (left with a
	// task's user by a killed shrooms).
	Worktrees []string `json:"worktrees"`
}

// GC removes every shrooms cage whose task has no turn running (the cages a
// crash left behind). Cages of running turns are left alone.
func (r *Commands) GC(ctx context.Context) (*GCReport, error) {
	cages, err := r.Podman.ListByLabel(ctx, sealed.LabelManaged, "1")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", fault.HostNotReady, err)
	}
	rep := &GCReport{Removed: []string{}, Busy: []string{}, Worktrees: []string{}}
	tasks := map[string]bool{}
	for _, c := range cages {
		// A prepared cage that has not started waits for its turn.
		waiting := c.Labels[turn.LabelPrepared] == "1" && (c.State == "initialized" || c.State == "created")
		if r.Ours(c) && !waiting {
			tasks[c.Labels[sealed.LabelTask]] = true
		}
	}
	for task := range tasks {
		id, err := taskid.Parse(task)
		if err != nil {
			continue // a label that is no valid task id is not ours to trust
		}
		lock, err := r.Store.LockTask(id)
		if errors.Is(err, taskstate.ErrBusy) {
			rep.Busy = append(rep.Busy, task)
			continue
		}
		if err != nil {
			// A label that is no valid task id is not ours to trust: leave it.
			continue
		}
		removed, err := r.RemoveLeftovers(ctx, task, r.waitingPrepared(cages, task)...)
		lock.Release()
		rep.Removed = append(rep.Removed, removed...)
		if err != nil {
			return rep, fmt.Errorf("%w: %w", fault.HostNotReady, err)
		}
	}
	// Old HOME trees whose cleanup a crash interrupted.
	entries, err := os.ReadDir(filepath.Join(r.Cfg.State.Dir, "tasks"))
	if err != nil && !os.IsNotExist(err) {
		return rep, fmt.Errorf("%w: %w", fault.HostNotReady, err)
	}
	for _, e := range entries {
		if ok, err := r.Podman.VolumeExists(ctx, r.Home().Name(e.Name())); err != nil || !ok {
			continue // no HOME volume (yet): nothing to clean
		}
		// Through its size-capped filesystem (mounted again after a reboot),
		// never the bare volume directory underneath.
		root, err := r.Home().Mounted(ctx, e.Name())
		if err != nil {
			return rep, err
		}
		cr, err := homereset.Cleanup(ctx, root)
		if err != nil {
			return rep, fmt.Errorf("%w: HOME cleanup of %s: %w", fault.HostNotReady, e.Name(), err)
		}
		rep.HomeTrees += len(cr.Trees)
	}
	given, err := r.GiveBackIdle()
	rep.Worktrees = append(rep.Worktrees, given...)
	if err != nil {
		return rep, fmt.Errorf("%w: %w", fault.HostNotReady, err)
	}
	return rep, nil
}

// waitingPrepared lists the task's prepared cages that have not started.
func (r *Commands) waitingPrepared(cages []podman.Cage, task string) []string {
	var ids []string
	for _, c := range cages {
		if c.Labels[sealed.LabelTask] == task && c.Labels[turn.LabelPrepared] == "1" && (c.State == "initialized" || c.State == "created") {
			ids = append(ids, c.ID)
		}
	}
	return ids
}
