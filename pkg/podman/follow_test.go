package podman

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containers/podman/v5/pkg/specgen"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// startCage creates and starts a cage-like container (no network, no log
// driver, as shrooms' cages) running script on client, attached to out.
func startCage(t *testing.T, client *Client, script string, out *itest.Buffer) (string, <-chan error) {
	t.Helper()
	ctx := context.Background()
	s := specgen.NewSpecGenerator(itest.TestImage, false)
	s.Name = itest.UniqueName("shrooms-follow-")
	s.Command = []string{"sh", "-c", script}
	s.NetNS = specgen.Namespace{NSMode: specgen.NoNetwork}
	s.LogConfiguration = &specgen.LogConfig{Driver: "none"}
	no := false
	s.Remove = &no
	id, err := client.Create(ctx, s)
	assert.NilError(t, err)
	t.Cleanup(func() {
		// Through the shared service: the private one may be down.
		shared, err := Connect(context.Background(), itest.Socket())
		if err == nil {
			_ = shared.Remove(context.Background(), id)
		}
	})
	attached, err := client.Start(ctx, id, Streams{Stdout: out, Stderr: out})
	assert.NilError(t, err)
	return id, attached
}

const restartScript = `echo before; sleep 4; echo after; exit 7`

// TestFollowRidesThroughServiceRestart kills the podman service (SIGKILL)
// while a cage runs and starts it again: Follow returns the real exit code
// and the output printed after the service came back.
func TestFollowRidesThroughServiceRestart(t *testing.T) {
	svc := itest.StartService(t)
	ctx := context.Background()
	client, err := Connect(ctx, svc.URI)
	assert.NilError(t, err)
	var out itest.Buffer
	id, attached := startCage(t, client, restartScript, &out)
	itest.WaitFor(t, 10*time.Second, "the cage's first line", func() bool { return strings.Contains(out.String(), "before") })

	svc.Kill()
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		time.Sleep(time.Second)
		svc.Start()
	}()
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	code, err := client.Follow(wctx, id, Streams{Stdout: &out, Stderr: &out}, attached)
	<-restarted
	assert.NilError(t, err)
	assert.Equal(t, code, int32(7))
	assert.Equal(t, out.String(), "before\nafter\n")
}

// TestPlainWaitFailsOnServiceRestart is the positive control: the same
// sequence without riding through (the stream's end, then podman's wait, as
// turns did before) fails with a connection error and loses the exit code.
func TestPlainWaitFailsOnServiceRestart(t *testing.T) {
	svc := itest.StartService(t)
	ctx := context.Background()
	client, err := Connect(ctx, svc.URI)
	assert.NilError(t, err)
	var out itest.Buffer
	id, attached := startCage(t, client, restartScript, &out)
	itest.WaitFor(t, 10*time.Second, "the cage's first line", func() bool { return strings.Contains(out.String(), "before") })

	svc.Kill()
	<-attached
	_, err = client.Wait(ctx, id)
	assert.Assert(t, err != nil, "wait answered although the service is down")
	assert.Assert(t, IsConnectionError(err), "%v", err)
	assert.Assert(t, is.Contains(err.Error(), "wait for cage"))
	svc.Start()
	assert.Equal(t, out.String(), "before\n", "without re-attaching, the rest of the output is lost")
}

// TestFollowCageRemovedDuringOutage removes the cage (through another
// service on the same storage) while the turn's service is down: Follow says
// in one line that the cage is gone.
func TestFollowCageRemovedDuringOutage(t *testing.T) {
	svc := itest.StartService(t)
	ctx := context.Background()
	client, err := Connect(ctx, svc.URI)
	assert.NilError(t, err)
	var out itest.Buffer
	id, attached := startCage(t, client, `echo before; sleep 60; exit 7`, &out)
	itest.WaitFor(t, 10*time.Second, "the cage's first line", func() bool { return strings.Contains(out.String(), "before") })

	svc.Kill()
	shared, err := Connect(ctx, itest.Socket())
	assert.NilError(t, err)
	assert.NilError(t, shared.Remove(ctx, id))
	go func() {
		time.Sleep(500 * time.Millisecond)
		svc.Start()
	}()
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	_, err = client.Follow(wctx, id, Streams{Stdout: &out}, attached)
	assert.Assert(t, errors.Is(err, ErrCageGone), "%v", err)
	assert.Assert(t, is.Contains(err.Error(), "was removed behind shrooms' back (e.g. while the podman service was unreachable)"))
	assert.Assert(t, !strings.Contains(err.Error(), "\n"))
}

func TestIsConnectionError(t *testing.T) {
	for _, c := range []struct {
		msg  string
		want bool
	}{
		{`wait for cage: Post "http://d/v5.0.0/libpod/containers/x/wait": dial unix /run/x.sock: connect: no such file or directory`, true},
		{`inspect cage: dial unix /run/x.sock: connect: connection refused`, true},
		{`inspect cage: no such container`, false},
		{`remove cage abc: container is running`, false},
	} {
		assert.Equal(t, IsConnectionError(errors.New(c.msg)), c.want, c.msg)
		assert.Equal(t, isNotFound(errors.New(c.msg)), strings.Contains(c.msg, "no such container"), c.msg)
	}
}

// TestFollowGivesUpAtDeadline: a service that never comes back is waited
// for only until the turn's deadline.
func TestFollowGivesUpAtDeadline(t *testing.T) {
	svc := itest.StartService(t)
	ctx := context.Background()
	client, err := Connect(ctx, svc.URI)
	assert.NilError(t, err)
	var out itest.Buffer
	id, attached := startCage(t, client, `echo before; sleep 60`, &out)
	itest.WaitFor(t, 10*time.Second, "the cage's first line", func() bool { return strings.Contains(out.String(), "before") })
	svc.Kill()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	_, err = client.Follow(wctx, id, Streams{Stdout: &out}, attached)
	assert.Assert(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	assert.Assert(t, time.Since(start) < 5*time.Second, "took %s", time.Since(start))
}

// TestFollowCageExitedDuringOutage: a cage that ends while the service is
// away still yields its real exit code; what it printed meanwhile is lost
// (nobody was attached, and the cage logs nowhere).
func TestFollowCageExitedDuringOutage(t *testing.T) {
	svc := itest.StartService(t)
	ctx := context.Background()
	client, err := Connect(ctx, svc.URI)
	assert.NilError(t, err)
	var out itest.Buffer
	id, attached := startCage(t, client, `echo before; sleep 1; echo during; exit 7`, &out)
	itest.WaitFor(t, 10*time.Second, "the cage's first line", func() bool { return strings.Contains(out.String(), "before") })
	svc.Kill()
	time.Sleep(3 * time.Second)
	svc.Start()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	code, err := client.Follow(wctx, id, Streams{Stdout: &out}, attached)
	assert.NilError(t, err)
	assert.Equal(t, code, int32(7))
	assert.Equal(t, out.String(), "before\n")
}

// TestStartWaitsForTheService: a start while the service is down is sent
// again once it is back.
func TestStartWaitsForTheService(t *testing.T) {
	svc := itest.StartService(t)
	ctx := context.Background()
	client, err := Connect(ctx, svc.URI)
	assert.NilError(t, err)
	s := specgen.NewSpecGenerator(itest.TestImage, false)
	s.Name = itest.UniqueName("shrooms-start-")
	s.Command = []string{"sleep", "30"}
	s.NetNS = specgen.Namespace{NSMode: specgen.NoNetwork}
	id, err := client.Create(ctx, s)
	assert.NilError(t, err)
	t.Cleanup(func() {
		if shared, err := Connect(context.Background(), itest.Socket()); err == nil {
			_ = shared.Remove(context.Background(), id)
		}
	})
	svc.Kill()
	go func() {
		time.Sleep(time.Second)
		svc.Start()
	}()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	assert.NilError(t, client.start(wctx, id))
	status, err := client.status(ctx, id)
	assert.NilError(t, err)
	assert.Equal(t, status, "running")
}
