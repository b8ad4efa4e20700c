package turn

import (
	"context"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/engine"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// TestWaitingForTheLockIsNotStarting: a turn that waits for its task's lock
// (held by the previous turn's detached teardown) does not count as
// starting. The teardown lets starting turns go first (WaitStarts, up to
// 2 s); with the mark taken before the lock, it waited its full time for
// the very turn that waited for it, and back-to-back turns of one task ran
// at ~0.5 turns/s. The control: a turn marked starting does hold a
// teardown back.
func TestWaitingForTheLockIsNotStarting(t *testing.T) {
	e, runner := newHarness(t, "")
	task := e.Task("startmark")
	_, _, _, err := sh(runner, task, "", "true") // bootstrap, outside the measure
	assert.NilError(t, err)

	// The previous turn's teardown holds the task's lock.
	l, err := runner.Store.LockTask(taskid.Must(task))
	assert.NilError(t, err)
	f, dir, err := l.HandOff()
	assert.NilError(t, err)
	teardown, err := taskstate.AdoptLock(dupFile(t, f), dupFile(t, dir))
	assert.NilError(t, err)
	assert.NilError(t, l.Release())
	defer teardown.Release()

	done := make(chan error, 1)
	go func() { _, _, _, err := sh(runner, task, "", "true"); done <- err }()
	time.Sleep(2 * time.Second) // the turn's check is done; it waits for the lock
	start := time.Now()
	runner.Store.WaitStarts(context.Background(), time.Second)
	waited := time.Since(start)
	select {
	case err := <-done:
		t.Fatalf("the turn ended while the teardown held its lock: %v", err)
	default:
	}
	assert.Assert(t, waited < 500*time.Millisecond, "the teardown waited %v for a turn that waits for its lock", waited)
	assert.NilError(t, teardown.Release())
	assert.NilError(t, <-done)

	// The control: a turn that is starting holds the teardown back.
	mark, err := runner.Store.Starting()
	assert.NilError(t, err)
	start = time.Now()
	runner.Store.WaitStarts(context.Background(), time.Second)
	assert.Assert(t, time.Since(start) >= time.Second, "a starting turn did not hold the teardown back")
	assert.NilError(t, mark.Release())
}

func dupFile(t *testing.T, f *os.File) *os.File {
	fd, err := unix.Dup(int(f.Fd()))
	assert.NilError(t, err)
	return os.NewFile(uintptr(fd), f.Name())
}

// TestCheckingIsStarting: a turn counts as starting from its checks on,
// before it takes its task's lock: a burst's turns are mostly in their
// checks (the seal, the image) when the first of them ends and its
// detached teardown begins, and that teardown's podman work went in front
// of them. The turn is held in its check by the image's inspection; the
// control: once it ran, nothing holds a teardown back.
func TestCheckingIsStarting(t *testing.T) {
	e, runner := newHarness(t, "")
	task := e.Task("checkmark")
	_, _, _, err := sh(runner, task, "", "true")
	assert.NilError(t, err)

	gated := &gatedImage{Engine: runner.Podman, entered: make(chan struct{}, 1), gate: make(chan struct{})}
	runner.Podman = gated
	done := make(chan error, 1)
	go func() { _, _, _, err := sh(runner, task, "", "true"); done <- err }()
	<-gated.entered // the turn is in its check
	start := time.Now()
	runner.Store.WaitStarts(context.Background(), time.Second)
	waited := time.Since(start)
	close(gated.gate)
	assert.NilError(t, <-done)
	assert.Assert(t, waited >= time.Second, "a turn in its check did not hold a teardown back (waited %v)", waited)

	start = time.Now()
	runner.Store.WaitStarts(context.Background(), time.Second)
	assert.Assert(t, time.Since(start) < 500*time.Millisecond, "a teardown waited %v with no turn starting", time.Since(start))
}

// gatedImage holds the image's inspection until gate closes.
type gatedImage struct {
	engine.Engine
	entered, gate chan struct{}
}

func (g *gatedImage) InspectImage(ctx context.Context, ref string) (podman.Image, error) {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-g.gate
	return g.Engine.InspectImage(ctx, ref)
}
