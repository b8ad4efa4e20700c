package turn

import (
	"context"
	"errors"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/engine"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// fakeEngine is an in-memory engine.Engine for tests that need no podman.
// It implements what these tests call; any other method panics through the
// nil embedded interface, so a test that reaches one fails loudly.
type fakeEngine struct {
	engine.Engine
	cages     []podman.Cage
	removeErr map[string]error
	removed   []string
}

func (f *fakeEngine) ListByLabel(_ context.Context, label, value string) ([]podman.Cage, error) {
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

// fakeRunner is a runner on a fake engine with a private state dir.
func fakeRunner(t *testing.T, e engine.Engine) *Runner {
	cfg := &config.Config{State: config.State{Dir: t.TempDir()}}
	return &Runner{Cfg: cfg, Podman: e, Store: taskstate.Store{Dir: cfg.State.Dir}}
}

func cage(id, task, state string) podman.Cage {
	return podman.Cage{ID: id, Name: "cage-" + id, Labels: map[string]string{sealed.LabelManaged: "1", sealed.LabelTask: task, sealed.LabelState: state}}
}

// TestRemoveLeftoversOnAFakeEngine: only this shrooms' cages of the task
// go, a kept one stays, and a failing removal stops with what was removed.
func TestRemoveLeftoversOnAFakeEngine(t *testing.T) {
	e := &fakeEngine{}
	r := fakeRunner(t, e)
	ours := sealed.StateLabel(r.Cfg.State.Dir)
	e.cages = []podman.Cage{
		cage("a", "t1", ours),
		cage("b", "t1", sealed.StateLabel("/other/state")), // another shrooms'
		cage("c", "t2", ours),                              // another task's
		cage("d", "t1", ours),
	}
	removed, err := r.RemoveLeftovers(context.Background(), taskid.Must("t1"), "d")
	assert.NilError(t, err)
	assert.DeepEqual(t, removed, []string{"cage-a"})
	assert.DeepEqual(t, e.removed, []string{"a"})

	e.removed = nil
	e.removeErr = map[string]error{"a": errors.New("device busy")}
	removed, err = r.RemoveLeftovers(context.Background(), taskid.Must("t1"))
	assert.ErrorContains(t, err, "device busy")
	assert.Equal(t, len(removed), 0)
	assert.Equal(t, len(e.removed), 0, "stops at the first failure")
}
