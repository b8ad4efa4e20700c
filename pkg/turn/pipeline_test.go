package turn

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/dnsseal"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

func claudeReq() Request {
	return Request{Task: taskid.Must("t1"), Agent: "claude", Args: []string{"-p", "hi"}}
}

// assertNoSecrets: no token secret outlives the turn, and one was put.
func assertNoSecrets(t *testing.T, e *pipeEngine, put bool) {
	t.Helper()
	assert.Equal(t, len(e.secrets), 0, "secrets left: %v", e.secrets)
	if put {
		assert.DeepEqual(t, e.everSecrets, []string{SecretName(taskid.Must("t1"), "anthropic")})
	}
}

func TestRunToItsExitOnFakes(t *testing.T) {
	e := newPipeEngine()
	e.exitCode = 3
	r, h := pipeRunner(t, e)
	res, err := r.Run(context.Background(), claudeReq())
	assert.NilError(t, err)
	assert.Equal(t, res.Status, "exited")
	assert.Equal(t, res.ExitCode, 3)
	assert.Equal(t, res.Turn, 1)
	assert.Assert(t, res.Removed)
	assert.Equal(t, len(e.cages), 0, "cage removed")
	assert.Equal(t, h.resets, 1)
	assert.Equal(t, h.outboxes, 1)
	assert.Equal(t, h.cleanups, 1, "old HOME trees cleaned while the agent ran")
	assertNoSecrets(t, e, true)
	last, err := r.Store.LastTurn(taskid.Must("t1"))
	assert.NilError(t, err)
	assert.Equal(t, last, 1, "the turn is counted")
	_, err = os.Stat(filepath.Join(taskstate.Layout{Dir: r.Cfg.State.Dir}.Task(taskid.Must("t1")), TurnsFile))
	assert.NilError(t, err, "the turn is recorded")
}

func TestRunCreateFails(t *testing.T) {
	e := newPipeEngine()
	e.createErr = errBoom
	r, _ := pipeRunner(t, e)
	res, err := r.Run(context.Background(), claudeReq())
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.ErrorContains(t, err, "boom")
	assert.Equal(t, res.Status, "error")
	assert.Equal(t, e.called("remove"), 1, "a half-made cage is removed by name")
	assert.Equal(t, e.called("start"), 0)
	assertNoSecrets(t, e, true)
}

func TestRunStartFails(t *testing.T) {
	e := newPipeEngine()
	e.startErr = errBoom
	r, _ := pipeRunner(t, e)
	res, err := r.Run(context.Background(), claudeReq())
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.Equal(t, res.Error, "boom")
	assert.Equal(t, e.called("stop"), 1, "stopped before removal")
	assert.Assert(t, res.Removed)
	assert.Equal(t, len(e.cages), 0)
	assertNoSecrets(t, e, true)
}

func TestRunWaitErrors(t *testing.T) {
	e := newPipeEngine()
	e.waitErr = errBoom
	r, _ := pipeRunner(t, e)
	res, err := r.Run(context.Background(), claudeReq())
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.Equal(t, e.called("wait"), 1, "the wait (Follow) ran once and its error ends the turn")
	assert.Equal(t, res.Status, "error")
	assert.Assert(t, res.Removed)
	assert.Equal(t, len(e.cages), 0)
	assertNoSecrets(t, e, true)
}

func TestRunRemoveFailsIsReported(t *testing.T) {
	e := newPipeEngine()
	e.removeErr = errors.New("device or resource busy")
	r, _ := pipeRunner(t, e)
	res, err := r.Run(context.Background(), claudeReq())
	assert.NilError(t, err, "the agent ran to its exit")
	assert.Equal(t, res.Status, "exited")
	assert.Assert(t, !res.Removed)
	assert.Equal(t, res.Error, "device or resource busy", "a failed removal is never silent")
	assertNoSecrets(t, e, true)
}

func TestRunDeadline(t *testing.T) {
	e := newPipeEngine()
	e.block = true
	r, _ := pipeRunner(t, e)
	req := claudeReq()
	req.Timeout = 50 * time.Millisecond
	res, err := r.Run(context.Background(), req)
	assert.Assert(t, errors.Is(err, fault.Deadline), "%v", err)
	assert.Equal(t, res.Status, "deadline")
	assert.ErrorContains(t, errors.New(res.Error), "deadline; cage stopped and removed")
	assert.Equal(t, e.called("stop"), 1)
	assert.Assert(t, res.Removed)
	assert.Equal(t, len(e.cages), 0)
	assertNoSecrets(t, e, true)
}

func TestRunInterrupted(t *testing.T) {
	e := newPipeEngine()
	e.block = true
	r, _ := pipeRunner(t, e)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-e.started
		cancel()
	}()
	res, err := r.Run(ctx, claudeReq())
	assert.Assert(t, errors.Is(err, fault.Interrupted), "%v", err)
	assert.Equal(t, res.Status, "interrupted")
	assert.Equal(t, e.called("stop"), 1)
	assert.Assert(t, res.Removed, "removal outlives the cancelled context")
	assert.Equal(t, len(e.cages), 0)
	assertNoSecrets(t, e, true)
}

func TestRunHomeResetFailsBeforeAnyCage(t *testing.T) {
	e := newPipeEngine()
	r, h := pipeRunner(t, e)
	h.resetErr = errBoom
	_, err := r.Run(context.Background(), claudeReq())
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.ErrorContains(t, err, "HOME reset failed, the turn does not start")
	assert.Equal(t, e.called("create"), 0)
	assert.Equal(t, len(e.everSecrets), 0, "no secret before HOME is ready")
	last, err := r.Store.LastTurn(taskid.Must("t1"))
	assert.NilError(t, err)
	assert.Equal(t, last, 0, "a turn that did not start is not counted")
}

func TestRunBadInputTouchesNothing(t *testing.T) {
	e := newPipeEngine()
	r, _ := pipeRunner(t, e)
	for _, req := range []Request{
		{Agent: "claude"}, // no task id
		{Task: taskid.Must("t1"), Agent: "nobody"},
		{Task: taskid.Must("t1"), Agent: "claude", Timeout: -time.Second},
	} {
		_, err := r.Run(context.Background(), req)
		assert.Assert(t, errors.Is(err, fault.Input), "%+v: %v", req, err)
	}
	assert.Equal(t, len(e.calls), 0)
	_, err := os.Stat(r.Cfg.State.Dir)
	assert.Assert(t, os.IsNotExist(err), "no state written for bad input")
}

func TestPrepareNextInitFails(t *testing.T) {
	e := newPipeEngine()
	e.initErr = errBoom
	r, _ := pipeRunner(t, e)
	r.Binary = "/usr/bin/shrooms"
	_, err := r.PrepareNext(context.Background(), claudeReq())
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.Equal(t, e.called("remove"), 1)
	assert.Equal(t, len(e.cages), 0, "the half-prepared cage is removed")
	assertNoSecrets(t, e, true)
}

// TestPreparedCageMatchesItsPlan: the plan a run computes for a prepared
// cage equals the one it was created from, so the run takes it; a change
// of config gives another plan, and a fresh cage.
func TestPreparedCageMatchesItsPlan(t *testing.T) {
	e := newPipeEngine()
	r, _ := pipeRunner(t, e)
	r.Binary = "/usr/bin/shrooms"
	id, err := r.PrepareNext(context.Background(), claudeReq())
	assert.NilError(t, err)
	res, err := r.Run(context.Background(), claudeReq())
	assert.NilError(t, err)
	assert.Assert(t, res.Prepared)
	assert.Equal(t, res.Cage, id)
	assert.Equal(t, e.called("create"), 1, "the prepared cage ran, no other was created")
	argv, err := os.ReadFile(filepath.Join(taskstate.Layout{Dir: r.Cfg.State.Dir}.Task(taskid.Must("t1")), "argv"))
	assert.NilError(t, err)
	assert.Equal(t, string(argv), `["claude","--dangerously-skip-permissions","-p","hi"]`)
	assertNoSecrets(t, e, true)

	_, err = r.PrepareNext(context.Background(), claudeReq())
	assert.NilError(t, err)
	r.Cfg.Cage.Memory *= 2
	res, err = r.Run(context.Background(), claudeReq())
	assert.NilError(t, err)
	assert.Assert(t, !res.Prepared, "a prepared cage of another plan is not taken")
	assert.Equal(t, e.called("create"), 3)
	assert.Equal(t, len(e.cages), 0, "the stale prepared cage went as a leftover")
}

// TestSpecGoldenOnFakes pins the spec of a turn as `shrooms spec` shows it
// (go test ./pkg/turn -run SpecGolden -update accepts a change) and shows
// that computing it writes nothing.
func TestSpecGoldenOnFakes(t *testing.T) {
	e := newPipeEngine()
	r, _ := pipeRunner(t, e)
	r.Host = nil // the real HOME root: podman's volume path, read only
	// Fixed paths, none of which exists: the spec must not need them.
	r.Cfg.State.Dir = "/nonexistent/shrooms-golden/state"
	r.Cfg.Outbox.Root = "/nonexistent/shrooms-golden/outbox"
	r.Store.Dir = r.Cfg.State.Dir
	s, err := r.Spec(context.Background(), claudeReq())
	assert.NilError(t, err)
	got, err := SpecJSON(s)
	assert.NilError(t, err)
	golden.Assert(t, string(got), "spec-claude.golden")
	_, err = os.Stat(r.Cfg.State.Dir)
	assert.Assert(t, os.IsNotExist(err), "spec wrote state")
	assert.Assert(t, is.Len(e.calls, 0))
}

// TestRunPutSecretFails: a secret that cannot be stored stops the turn
// before any cage exists, and the ones already stored go.
func TestRunPutSecretFails(t *testing.T) {
	e := newPipeEngine()
	r, _ := pipeRunner(t, e)
	a := r.Cfg.Agents["claude"]
	a.TokenEnv = map[string]string{"ANTHROPIC_API_KEY": "anthropic", "OTHER_KEY": "other"}
	r.Cfg.Agents["claude"] = a
	r.Cfg.Tokens["other"] = r.Cfg.Tokens["anthropic"]
	// Map order decides which is stored first: fail whichever comes second.
	e.putErr = map[string]error{}
	first := ""
	e.putHook = func(name string) {
		if first == "" {
			first = name
			return
		}
		e.putErr[name] = errBoom
	}
	_, err := r.Run(context.Background(), claudeReq())
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.Equal(t, len(e.everSecrets), 1, "one secret stored before the failure")
	assert.Equal(t, len(e.secrets), 0, "and removed")
	assert.Equal(t, e.called("create"), 0)
	last, err := r.Store.LastTurn(taskid.Must("t1"))
	assert.NilError(t, err)
	assert.Equal(t, last, 0)
}

// TestPlanIsAFunctionOfItsInput: the same input and host facts give the
// same spec (what prepared-cage matching relies on); any input that
// changes the cage changes it.
func TestPlanIsAFunctionOfItsInput(t *testing.T) {
	r, h := pipeRunner(t, newPipeEngine())
	r.Binary = "/usr/bin/shrooms"
	req := claudeReq()
	f := &facts{ids: taskstate.IDs{UID: 1879048192, GID: 1879048192}, turn: 4, root: h.root}
	hash := func(req Request, f *facts) string {
		in, err := checkInput(r.Cfg, req)
		assert.NilError(t, err)
		p, err := r.plan(req.Task, in, f, true)
		assert.NilError(t, err)
		s, err := specHash(p.spec)
		assert.NilError(t, err)
		return s
	}
	base := hash(req, f)
	assert.Equal(t, hash(req, f), base)
	changed := req
	changed.Args = []string{"other", "argv"}
	assert.Equal(t, hash(changed, f), base, "a prepared cage's argv is handed over at its run, not in its spec")
	changed = req
	changed.Streams.Stdin = strings.NewReader("")
	assert.Assert(t, hash(changed, f) != base, "stdin")
	f2 := *f
	f2.turn = 5
	assert.Assert(t, hash(req, &f2) != base, "turn")
	f2 = *f
	f2.root = h.root + "x"
	assert.Assert(t, hash(req, &f2) != base, "HOME")
}

// TestNetworkedTurnNeedsItsResolver: no resolver, no networked turn — a
// runner without one refuses before any cage exists, and a resolver that
// cannot be opened stops the turn before the cage starts (fail closed).
func TestNetworkedTurnNeedsItsResolver(t *testing.T) {
	e := newPipeEngine()
	r, _ := pipeRunner(t, e)
	r.Cfg.Network.Policy = "allowlist"
	r.Seal = func(context.Context, *config.Config, bool) (SealState, error) { return SealState{}, nil }
	_, err := r.Run(context.Background(), claudeReq())
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.ErrorContains(t, err, "needs the cage's resolver")
	assert.Equal(t, e.called("create"), 0)

	// Nor, under driver podman, without /run/netns shared in the
	// service's namespace (the runner's check of it, cagenet.ShareNetns
	// outside fakes).
	r.Cfg.Network.Driver = config.DriverPodman
	r.Resolver = func(context.Context, *config.Config, string) (func() dnsseal.Stats, error) { return nil, errBoom }
	_, err = r.Run(context.Background(), claudeReq())
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.ErrorContains(t, err, "needs /run/netns shared")
	r.Netns = netnsFunc(func(string) error { return errors.New("/run/netns cannot be made shared") })
	_, err = r.Run(context.Background(), claudeReq())
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.ErrorContains(t, err, "/run/netns cannot be made shared")
	assert.Equal(t, e.called("create"), 0)
	// The shrooms driver's cages have no netns of podman's: no check.
	r.Cfg.Network.Driver, r.Netns = config.DriverShrooms, nil

	r.CageWall = func(context.Context, SealState, int, bool) (firewall.WallStatus, error) {
		return firewall.WallStatus{OK: true}, nil
	}
	r.Resolver = func(context.Context, *config.Config, string) (func() dnsseal.Stats, error) { return nil, errBoom }
	res, err := r.Run(context.Background(), claudeReq())
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.ErrorContains(t, err, "cage resolver: boom")
	assert.Equal(t, e.called("start"), 0, "the cage never starts without its resolver")
	assert.Assert(t, res.Removed)

	// Positive control: with a resolver the same turn runs, and its counts
	// are in the result.
	r.Resolver = func(context.Context, *config.Config, string) (func() dnsseal.Stats, error) {
		return func() dnsseal.Stats { return dnsseal.Stats{Queries: 7} }, nil
	}
	res, err = r.Run(context.Background(), claudeReq())
	assert.NilError(t, err)
	assert.Equal(t, res.Status, "exited")
	assert.Assert(t, res.DNS != nil && res.DNS.Queries == 7)
}

// netnsFunc is a NetnsSharer on fakes.
type netnsFunc func(string) error

func (f netnsFunc) Share(socket string) error { return f(socket) }
