package cages

import (
	"context"
	"errors"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// fakeEngine is an in-memory Engine for tests that need no podman.
type fakeEngine struct {
	cages     []podman.Cage
	listErr   error
	removeErr map[string]error
	removed   []string
}

func (f *fakeEngine) ListByLabel(_ context.Context, label, value string) ([]podman.Cage, error) {
	if f.listErr != nil {
		return nil, f.listErr
	}
	var out []podman.Cage
	for _, c := range f.cages {
		if c.Labels[label] == value {
			out = append(out, c)
		}
	}
	return out, nil
}

func (f *fakeEngine) Remove(_ context.Context, id string) error {
	if err := f.removeErr[id]; err != nil {
		return err
	}
	f.removed = append(f.removed, id)
	return nil
}

func cage(id, task, state string) podman.Cage {
	return podman.Cage{ID: id, Name: "cage-" + id, Labels: map[string]string{sealed.LabelManaged: "1", sealed.LabelTask: task, sealed.LabelState: state}}
}

// TestRemoveLeftoversOnAFakeEngine: only this shrooms' cages of the task
// go, a kept one stays, and a failing removal stops with what was removed.
func TestRemoveLeftoversOnAFakeEngine(t *testing.T) {
	e := &fakeEngine{}
	s := Cages{Engine: e, StateDir: t.TempDir()}
	ours := sealed.StateLabel(s.StateDir)
	e.cages = []podman.Cage{
		cage("a", "t1", ours),
		cage("b", "t1", sealed.StateLabel("/other/state")), // another shrooms'
		cage("c", "t2", ours),                              // another task's
		cage("d", "t1", ours),
	}
	removed, _, err := s.RemoveLeftovers(context.Background(), taskid.Must("t1"), "d")
	assert.NilError(t, err)
	assert.DeepEqual(t, removed, []string{"cage-a"})
	assert.DeepEqual(t, e.removed, []string{"a"})

	e.removed = nil
	e.removeErr = map[string]error{"a": errors.New("device busy")}
	removed, _, err = s.RemoveLeftovers(context.Background(), taskid.Must("t1"))
	assert.ErrorContains(t, err, "device busy")
	assert.Equal(t, len(removed), 0)
	assert.Equal(t, len(e.removed), 0, "stops at the first failure")
}

// TestInUseOnAFakeEngine: a cage of the task in any state holds it, another
// shrooms' or another task's does not, and an engine that cannot list is
// the host's to fix.
func TestInUseOnAFakeEngine(t *testing.T) {
	ctx := context.Background()
	e := &fakeEngine{}
	s := Cages{Engine: e, StateDir: t.TempDir()}
	ours := sealed.StateLabel(s.StateDir)
	e.cages = []podman.Cage{
		cage("b", "t1", sealed.StateLabel("/other/state")),
		cage("c", "t2", ours),
	}
	busy, err := s.InUse(ctx, taskid.Must("t1"))
	assert.NilError(t, err)
	assert.Assert(t, !busy, "only another shrooms' and another task's cages")

	exited := cage("a", "t1", ours)
	exited.State = "exited"
	e.cages = append(e.cages, exited)
	busy, err = s.InUse(ctx, taskid.Must("t1"))
	assert.NilError(t, err)
	assert.Assert(t, busy, "an exited cage of the task still holds its HOME")

	e.listErr = errors.New("connection refused")
	_, err = s.InUse(ctx, taskid.Must("t1"))
	assert.ErrorIs(t, err, fault.HostNotReady)
	assert.ErrorContains(t, err, "connection refused")
}
