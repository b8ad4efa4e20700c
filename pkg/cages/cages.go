// Package cages finds the cages one shrooms state directory made on the
// engine: which are its own (sealed.Ours), whether a task still has one,
// and removing those a crashed shrooms left. The turn pipeline and the
// task commands both ask it, so a cage of the task is told the same way.
package cages

import (
	"context"
	"slices"

	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// Engine is what finding and removing cages asks of podman.
type Engine interface {
	ListByLabel(ctx context.Context, label, value string) ([]podman.Cage, error)
	Remove(ctx context.Context, id string) error
}

// Cages are the cages a shrooms with state directory StateDir made on
// Engine.
type Cages struct {
	Engine   Engine
	StateDir string
}

// Ours reports whether c was made by a shrooms with this state directory
// (gc and leftover removal touch no other).
func (s Cages) Ours(c podman.Cage) bool { return sealed.Ours(s.StateDir, c.Labels) }

// InUse reports whether any cage of task exists (whatever its state): its
// HOME must stay mounted for it. An engine that cannot list them is the
// host's to fix.
func (s Cages) InUse(ctx context.Context, task taskid.ID) (bool, error) {
	cages, err := s.Engine.ListByLabel(ctx, sealed.LabelTask, task.String())
	if err != nil {
		return false, fault.Wrap(fault.HostNotReady, err)
	}
	return slices.ContainsFunc(cages, s.Ours), nil
}

// RemoveLeftovers removes the cages of task that a crashed shrooms left
// behind, but those whose ids keep names; it returns the names of those it
// removed and the cages in keep its listing saw as task's and ours (a
// caller that removes one of them later needs no inspection of it: a
// cage's id and labels never change). Call it with the task lock held: no
// turn of the task can be running.
func (s Cages) RemoveLeftovers(ctx context.Context, task taskid.ID, keep ...string) (removed []string, kept []podman.Cage, err error) {
	cages, err := s.Engine.ListByLabel(ctx, sealed.LabelTask, task.String())
	if err != nil {
		return nil, nil, err
	}
	for _, c := range cages {
		if !s.Ours(c) || c.Labels[sealed.LabelTask] != task.String() {
			continue
		}
		if slices.Contains(keep, c.ID) {
			kept = append(kept, c)
			continue
		}
		if err := s.Engine.Remove(ctx, c.ID); err != nil {
			return removed, kept, err
		}
		removed = append(removed, c.Name)
	}
	return removed, kept, nil
}
