package task

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/home"
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
	// Released lists HOME loop devices (and their mounts) let go: of idle
	// tasks, and of deleted images (copied back first if their task exists).
	Released []string `json:"released"`
	// Outboxes lists the outboxes of idle tasks (left by a killed turn)
	// moved to their pending deliveries.
	Outboxes []string `json:"outboxes"`
	// Expired lists prepared cages removed for waiting longer than
	// cage.prepared_ttl.
	Expired []string `json:"expired"`
	// DryRun is true when gc only listed the cages it would remove and the
	// prepared cages it would expire (Removed, Expired), changing nothing.
	DryRun bool `json:"dryRun"`
}

// GC removes every shrooms cage whose task has no turn running (the cages a
// crash left behind). Cages of running turns are left alone.
func (r *Commands) GC(ctx context.Context) (*GCReport, error) {
	return r.gc(ctx, false)
}

// GCDryRun lists the leftover cages GC would remove and the prepared cages
// it would expire, changing nothing.
func (r *Commands) GCDryRun(ctx context.Context) (*GCReport, error) {
	return r.gc(ctx, true)
}

// gc is one phase: what fails in it without a kind of its own (the engine,
// the state directory, a HOME cleanup, a worktree give-back, what is left
// to release) is the host's to fix.
func (r *Commands) gc(ctx context.Context, dryRun bool) (rep *GCReport, err error) {
	defer fault.Phase(fault.HostNotReady, &err)
	rep = &GCReport{Removed: []string{}, Busy: []string{}, Worktrees: []string{}, Released: []string{}, Outboxes: []string{}, DryRun: dryRun}
	// First: a prepared cage that waited too long goes, and what it held
	// (HOME mount, secrets, outbox) is released below like any idle task's.
	expired, err := r.ExpirePrepared(ctx, dryRun)
	rep.Expired = expired
	if err != nil {
		return rep, err
	}
	cages, err := r.managedCages(ctx)
	if err != nil {
		return nil, err
	}
	if dryRun {
		for _, c := range cages {
			if r.ours(c) && !waiting(c) {
				id, err := taskid.Parse(c.Labels[sealed.LabelTask])
				if err != nil {
					continue
				}
				if pid, _ := r.lockHolder(id); pid != 0 {
					rep.Busy = append(rep.Busy, id.String())
					continue
				}
				rep.Removed = append(rep.Removed, c.Name)
			}
		}
		return rep, nil
	}
	tasks := map[string]bool{}
	for _, c := range cages {
		// A prepared cage that has not started waits for its turn.
		waiting := c.Labels[turn.LabelPrepared] == "1" && (c.State == "initialized" || c.State == "created")
		if r.ours(c) && !waiting {
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
		removed, _, err := r.cages().RemoveLeftovers(ctx, id, r.waitingPrepared(cages, id)...)
		lock.Release()
		rep.Removed = append(rep.Removed, removed...)
		if err != nil {
			return rep, err
		}
	}
	// Old HOME trees whose cleanup a crash interrupted.
	entries, err := os.ReadDir(taskstate.Layout{Dir: r.Cfg.State.Dir}.Tasks())
	if err != nil && !os.IsNotExist(err) {
		return rep, err
	}
	for _, e := range entries {
		id, err := taskid.Parse(e.Name())
		if err != nil {
			continue // no task's state dir
		}
		if ok, err := r.Podman.VolumeExists(ctx, r.Homes.Name(id)); err != nil || !ok {
			continue // no HOME volume (yet): nothing to clean
		}
		// Only a HOME still mounted: a turn cleans its own old tree while
		// it runs, so an interrupted cleanup is one whose shrooms was killed
		// with HOME mounted (mounting every idle HOME here would cost a
		// mount per task per gc).
		homes := r.Homes
		vol := homes.Volume(id)
		root, err := homes.Root(ctx, vol)
		if err != nil {
			return rep, err
		}
		if !homes.IsMounted(vol, root) {
			continue
		}
		trees, err := home.Cleanup(ctx, root)
		if err != nil {
			return rep, fmt.Errorf("HOME cleanup of %s: %w", e.Name(), err)
		}
		rep.HomeTrees += trees
	}
	if err := r.settleIdle(ctx, entries, cages, rep); err != nil {
		return rep, err
	}
	given, err := r.Worktrees.GiveBackIdle()
	rep.Worktrees = append(rep.Worktrees, given...)
	if err != nil {
		return rep, err
	}
	// Last: the HOMEs mounted above, and those a killed shrooms left.
	rep.Released, err = r.ReleaseIdle(ctx)
	return rep, err
}

// waitingPrepared lists the task's prepared cages that have not started.
func (r *Commands) waitingPrepared(cages []podman.Cage, task taskid.ID) []string {
	var ids []string
	for _, c := range cages {
		if c.Labels[sealed.LabelTask] == task.String() && c.Labels[turn.LabelPrepared] == "1" && (c.State == "initialized" || c.State == "created") {
			ids = append(ids, c.ID)
		}
	}
	return ids
}

// settleIdle moves what killed turns left in the outboxes of idle tasks
// (no turn running, no cage left: a prepared one keeps its empty outbox)
// to their pending deliveries.
func (r *Commands) settleIdle(ctx context.Context, tasks []os.DirEntry, cages []podman.Cage, rep *GCReport) error {
	for _, e := range tasks {
		id, err := taskid.Parse(e.Name())
		if err != nil || len(r.waitingPrepared(cages, id)) > 0 {
			continue
		}
		if _, err := os.Lstat(filepath.Join(r.Cfg.Outbox.Root, e.Name())); err != nil {
			continue // no outbox was ever mounted
		}
		lock, err := r.Store.LockTask(id)
		if err != nil {
			continue // its turn runs
		}
		err = func() error {
			defer lock.Release()
			if busy, err := r.cages().InUse(ctx, id); err != nil || busy {
				return err
			}
			m, err := r.settleOutbox(ctx, id)
			if m != nil && err == nil {
				rep.Outboxes = append(rep.Outboxes, fmt.Sprintf("%s turn %d", e.Name(), m.Turn))
			}
			return err
		}()
		if err != nil {
			return fmt.Errorf("outbox of %s: %w", e.Name(), err)
		}
	}
	return nil
}
