package turn

import (
	"context"
	"errors"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/engine"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
)

// onPrivateService points runner at a podman service of the test's own,
// which the test may kill and restart; shared is the engine it used before
// (the shared test service, which it goes back to when the test ends).
func onPrivateService(t *testing.T, runner *Runner) (svc *itest.Service, shared engine.Engine) {
	svc = itest.StartService(t)
	before, socket := *runner, runner.Cfg.Podman.Socket
	runner.Cfg.Podman.Socket = svc.URI
	client, err := podman.Connect(context.Background(), svc.URI)
	assert.NilError(t, err)
	*runner = *NewRunner(runner.Cfg, client, nil)
	// Cleanups run last-registered first: the env's cleanup (which needs
	// podman) goes back to the shared service before this one stops.
	t.Cleanup(func() {
		runner.Cfg.Podman.Socket = socket
		*runner = *NewRunner(runner.Cfg, before.Podman, nil)
	})
	return svc, before.Podman
}

// runAsync runs one shell turn in the background; out collects its output.
func runAsync(runner *Runner, task, script string, out *itest.Buffer) <-chan turnDone {
	done := make(chan turnDone, 1)
	go func() {
		res, err := runner.Run(context.Background(), Request{
			Task: taskid.Must(task), Agent: "shell", Args: []string{"-c", script},
			Streams: podman.Streams{Stdout: out, Stderr: out},
		})
		done <- turnDone{res, err}
	}()
	return done
}

type turnDone struct {
	res *Result
	err error
}

// TestTurnRidesThroughPodmanRestart kills the podman service (SIGKILL, the
// pid this test started) in the middle of a turn and starts it again a
// second later: the turn returns the agent's real exit code and output, and
// its cage is removed. (The positive control, the same sequence failing
// without riding through, is pkg/podman's TestPlainWaitFailsOnServiceRestart.)
func TestTurnRidesThroughPodmanRestart(t *testing.T) {
	e, runner := newHarness(t, "")
	svc, _ := onPrivateService(t, runner)
	var out itest.Buffer
	done := runAsync(runner, e.Task("restart"), `echo before; sleep 1; echo running; sleep 4; echo after; exit 7`, &out)
	// Past its start (a kill during the start request itself is not ridden
	// through, see podman.Client.start): the agent's second line.
	itest.WaitFor(t, 60*time.Second, "the turn's second line", func() bool { return strings.Contains(out.String(), "running") })
	svc.Kill()
	time.Sleep(time.Second)
	svc.Start()
	d := <-done
	assert.NilError(t, d.err, "%+v", d.res)
	assert.Equal(t, d.res.Status, "exited", d.res.Error)
	assert.Equal(t, d.res.ExitCode, 7)
	assert.Equal(t, out.String(), "before\nrunning\nafter\n")
	assert.Assert(t, d.res.Removed, "cage not removed: %s", d.res.Error)
}

// TestTurnCageRemovedDuringPodmanOutage removes the turn's cage behind
// shrooms' back while the service is down: the turn ends with status error
// and one line saying the cage is gone.
func TestTurnCageRemovedDuringPodmanOutage(t *testing.T) {
	e, runner := newHarness(t, "")
	svc, shared := onPrivateService(t, runner)
	var out itest.Buffer
	task := e.Task("gone")
	done := runAsync(runner, task, `echo before; sleep 1; echo running; sleep 60; exit 7`, &out)
	// Past its start (a kill during the start request itself is not ridden
	// through, see podman.Client.start): the agent's second line.
	itest.WaitFor(t, 60*time.Second, "the turn's second line", func() bool { return strings.Contains(out.String(), "running") })
	svc.Kill()
	cages, err := shared.ListByLabel(context.Background(), sealed.LabelTask, task)
	assert.NilError(t, err)
	assert.Equal(t, len(cages), 1)
	assert.NilError(t, shared.Remove(context.Background(), cages[0].ID))
	svc.Start()
	d := <-done
	assert.Assert(t, errors.Is(d.err, ErrHostNotReady), "%v", d.err)
	assert.Equal(t, d.res.Status, "error")
	assert.Assert(t, is.Contains(d.res.Error, "was removed behind shrooms' back (e.g. while the podman service was unreachable); its remaining output and exit code are lost"))
	assert.Assert(t, !strings.Contains(d.res.Error, "\n"))
	assert.Equal(t, d.res.ExitCode, -1)
}
