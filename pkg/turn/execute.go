package turn

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/dnsseal"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/gateway"
	"github.com/shrooms-cage/shrooms/pkg/podman"
)

// CleanupTimeout bounds the removal of a cage after the turn's context ended.
const CleanupTimeout = 30 * time.Second

// execute creates, starts, waits for and always removes the turn's cage.
func (r *Runner) execute(ctx context.Context, p *prepared, streams podman.Streams, c *clock, preparedID string) (*Result, error) {
	res := c.res
	res.CageName = p.name
	// Removal must outlive ctx: Ctrl-C and deadlines are exactly when it matters.
	cleanupCtx := context.WithoutCancel(ctx)
	// Deferred first, so it runs last: after the cage is removed.
	defer func() {
		if !p.detach {
			r.removeSecrets(p.secrets)
		}
	}()

	id, err := preparedID, error(nil)
	if id == "" {
		id, err = r.Podman.Create(ctx, p.spec)
	}
	if err != nil {
		// A create that failed half-way may still have left a container.
		r.remove(cleanupCtx, res.CageName, res)
		if ctx.Err() != nil {
			res.Status = "interrupted"
		}
		res.Error = err.Error()
		return res, r.interrupted(ctx, err)
	}
	res.Cage = id
	defer func() {
		if !p.detach { // else a detached child removes it (detach.go)
			r.remove(cleanupCtx, id, res)
		}
	}()
	c.lap("create")
	if err := r.ranImage(ctx, id, p, res); err != nil {
		res.Error = err.Error()
		return res, err
	}
	if err := r.ranRuntime(ctx, id, p, res); err != nil {
		res.Error = err.Error()
		return res, err
	}
	initialised := preparedID != ""
	if gvisor(r.Cfg.Cage.Runtime) || gvisor(p.runtime) {
		// runsc boots the sandbox at init: its flags are checked before
		// anything of the agent runs. The runtime podman reports counts
		// too: cage.runtime "default" on a service whose own runtime is
		// runsc makes a gVisor cage all the same.
		if !initialised {
			if err := r.Podman.Init(ctx, id); err != nil {
				res.Error = err.Error()
				return res, r.interrupted(ctx, err)
			}
			c.lap("init")
			initialised = true
		}
		if err := r.checkSandbox(ctx, id); err != nil {
			res.Error = err.Error()
			return res, err
		}
	}

	deadline := p.timeout
	timeoutCtx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	// A gateway limit ends the turn like its deadline does, with its cause.
	waitCtx, cancelWait := context.WithCancelCause(timeoutCtx)
	defer cancelWait(nil)
	// The in-cage wall before anything can run in the cage's namespace.
	if !initialised && r.Cfg.Network.Networked() {
		// Its network namespace exists from here; no process of it runs.
		if err := r.Podman.Init(ctx, id); err != nil {
			res.Error = err.Error()
			return res, r.interrupted(ctx, err)
		}
		c.lap("init")
		initialised = true
	}
	wall, err := r.wallCage(ctx, id, p, preparedID != "")
	if err != nil {
		res.Error = err.Error()
		return res, r.interrupted(ctx, err)
	}
	if wall != nil {
		res.CageWall = wall
		c.lap("wall")
	}
	// The cage must see the worktree before anything of it runs (an
	// idmapped one's staging mount is made where the runtime should see
	// it; a relay's would not). gVisor's process root is the sandbox's,
	// not the cage's.
	if p.worktree != "" && !gvisor(r.Cfg.Cage.Runtime) && !gvisor(p.runtime) {
		if !initialised {
			if err := r.Podman.Init(ctx, id); err != nil {
				res.Error = err.Error()
				return res, r.interrupted(ctx, err)
			}
			c.lap("init")
			initialised = true
		}
		if err := r.checkWorktreeSeen(ctx, id, p.Plan); err != nil {
			res.Error = err.Error()
			return res, r.interrupted(ctx, err)
		}
		c.lap("worktree-seen")
	}
	if p.gateway != nil {
		gw, err := r.startGateway(ctx, id, p, initialised, p.gateway, func(reason string) { cancelWait(&limitError{reason}) },
			func(reason string) { cancelWait(&historyError{reason}) })
		if err != nil {
			res.Error = err.Error()
			return res, r.interrupted(ctx, err)
		}
		defer func() {
			gw.Close()
			u := gw.Usage()
			res.Usage = &u
			res.History = gw.HistoryReports()
		}()
		c.lap("gateway")
	}
	if r.Cfg.Network.Networked() {
		// The cage is initialised (above): no process of it runs yet, and
		// none will before the resolver listens.
		stop, err := r.startResolver(ctx, id, p, initialised)
		if err != nil {
			res.Error = err.Error()
			return res, r.interrupted(ctx, err)
		}
		defer func() {
			st := stop()
			res.DNS = &st
		}()
		c.lap("resolver")
	}
	// The spec says whether the cage has a terminal: attach need not ask.
	streams.TTY = p.spec.Terminal
	attachEnded, err := r.Podman.Start(waitCtx, id, streams)
	if err != nil {
		return res, r.stopped(ctx, waitCtx, id, res, err, deadline)
	}
	c.lap("start")
	c.started()
	if p.idmap && preparedID == "" {
		// runc has bound the worktree's staging mount: it goes now (the
		// give-back would detach it too).
		if err := r.claims().UnstageDir(p.staging); err != nil {
			res.Error = err.Error()
			return res, r.stopped(ctx, waitCtx, id, res, err, deadline)
		}
	}
	// The seal is watched while the cage runs; one that cannot be put back
	// stops the cage (sealwatch.go).
	sealLost, endWatch := r.watchSeal(waitCtx, res, cancel)
	defer endWatch()

	// The old HOME tree goes while the agent works, off the critical path.
	defer r.cleanOldHome(cleanupCtx, p)()

	// Follow rides through a restart of the podman service (pkg/podman).
	code, err := r.Podman.Follow(waitCtx, id, streams, attachEnded)
	if err != nil {
		if lost := sealLost(); lost != nil && ctx.Err() == nil {
			err = r.stopped(ctx, waitCtx, id, res, lost, deadline)
			res.Status = "seal-lost"
			res.Error = lost.Error() + "; cage stopped and removed"
			return res, err
		}
		return res, r.stopped(ctx, waitCtx, id, res, err, deadline)
	}
	c.lap("wait")
	// Before removal, while podman still has the cage's state.
	res.OOMKilled, _ = r.Podman.OOMKilled(cleanupCtx, id)
	res.ExitCode = int(code)
	res.Status = "exited"
	// The result is known: removal goes to a detached child (detach.go).
	p.detach = r.Detach != nil
	return res, nil
}

// cleanOldHome deletes the previous turn's HOME tree in the background and
// returns the wait for it (which a detached teardown cuts short: the child
// finishes it).
func (r *Runner) cleanOldHome(ctx context.Context, p *prepared) (wait func()) {
	if p.root == "" {
		return func() {}
	}
	cleaned := make(chan struct{})
	cleanCtx, stopClean := context.WithCancel(ctx)
	go func() {
		defer close(cleaned)
		_ = r.host().Cleanup(cleanCtx, p.root)
	}()
	return func() {
		if p.detach {
			stopClean()
		}
		<-cleaned
		stopClean()
	}
}

// stopped handles a turn whose start or wait ended early: by its deadline,
// by interruption or by an error. The cage is stopped before it is removed so
// the agent gets its grace period.
func (r *Runner) stopped(ctx, waitCtx context.Context, id string, res *Result, cause error, deadline time.Duration) error {
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeout)
	defer cancel()
	_ = r.Podman.Stop(stopCtx, id, r.Cfg.Cage.StopGrace.Std())
	var limit *limitError
	var hist *historyError
	switch {
	case errors.As(context.Cause(waitCtx), &hist):
		res.Status = "history-mismatch"
		res.Error = hist.reason + "; cage stopped and removed"
		return fmt.Errorf("%w: %s", ErrHistory, hist.reason)
	case errors.As(context.Cause(waitCtx), &limit):
		res.Status = "limit"
		res.Error = "the model gateway ended the turn: " + limit.reason + "; cage stopped and removed"
		return fmt.Errorf("%w: %s", ErrLimit, limit.reason)
	case ctx.Err() != nil:
		res.Status = "interrupted"
		res.Error = "interrupted; cage stopped and removed"
		return ErrInterrupted
	case errors.Is(waitCtx.Err(), context.DeadlineExceeded):
		res.Status = "deadline"
		res.Error = fmt.Sprintf("turn exceeded its %s deadline; cage stopped and removed", deadline)
		return ErrDeadline
	}
	res.Error = cause.Error()
	return fmt.Errorf("%w: %w", ErrHostNotReady, cause)
}

// ErrLimit is a turn ended by a per-turn model usage limit.
var ErrLimit error = fault.Limit

type limitError struct{ reason string }

// ErrHistory is a turn ended by a conversation history mismatch.
var ErrHistory error = fault.History

type historyError struct{ reason string }

func (e *historyError) Error() string { return e.reason }

func (e *limitError) Error() string { return e.reason }

// startGateway opens the turn's model gateway on the cage's own loopback:
// the cage is initialised first (a prepared one already is), so its network
// namespace exists and no process of it runs yet. The listener is this
// process's: it goes when the turn ends, or with shrooms if it is killed.
func (r *Runner) startGateway(ctx context.Context, id string, p *prepared, initialised bool, cfg *gateway.Config, onLimit, onHistory func(string)) (*gateway.Gateway, error) {
	if !initialised {
		if err := r.Podman.Init(ctx, id); err != nil {
			return nil, err
		}
	}
	pid, err := r.cagePid(ctx, id, p)
	if err != nil {
		return nil, err
	}
	c := *cfg
	c.OnLimit = onLimit
	c.OnHistory = onHistory
	gw, err := gateway.New(c)
	if err != nil {
		return nil, err
	}
	ln, err := gateway.ListenInNetNS(fmt.Sprintf("/proc/%d/ns/net", pid), fmt.Sprintf("127.0.0.1:%d", gateway.Port))
	if err != nil {
		return nil, err
	}
	gw.Serve(ln)
	return gw, nil
}

// startResolver opens the cage's resolver on its own loopback (cagenet),
// initialising the cage first unless it is already: no resolver, no turn.
func (r *Runner) startResolver(ctx context.Context, id string, p *prepared, initialised bool) (func() dnsseal.Stats, error) {
	if r.Resolver == nil {
		return nil, fmt.Errorf("network policy %q needs the cage's resolver", r.Cfg.Network.Policy)
	}
	if !initialised {
		if err := r.Podman.Init(ctx, id); err != nil {
			return nil, err
		}
	}
	pid, err := r.cagePid(ctx, id, p)
	if err != nil {
		return nil, err
	}
	stop, err := r.Resolver(ctx, r.Cfg, fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, fmt.Errorf("cage resolver: %w", err)
	}
	return stop, nil
}

func (r *Runner) interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ErrInterrupted
	}
	return fmt.Errorf("%w: %w", ErrHostNotReady, err)
}

// removeSecrets deletes a turn's token secrets (best effort: a leftover is
// replaced at the task's next turn and only root can read it).
func (r *Runner) removeSecrets(names []string) {
	ctx, cancel := context.WithTimeout(context.Background(), CleanupTimeout)
	defer cancel()
	for _, n := range names {
		_ = r.Podman.RemoveSecret(ctx, n)
	}
}

// cageMayRun says why processes of the turn's cage may still run once
// execute returned, "" when none can: on an error path its stop and
// removal are best effort, and only a removal that succeeded (forced, no
// grace) ends them. On the agent's own exit its PID namespace ended with
// it, whoever removes the cage (a detached child, or a removal that fails).
func cageMayRun(res *Result, err error) string {
	if err == nil || res.Removed {
		return ""
	}
	return "the cage may still run (not removed)"
}

// remove removes the cage; a failure is recorded, never silent.
func (r *Runner) remove(ctx context.Context, id string, res *Result) {
	rctx, cancel := context.WithTimeout(ctx, CleanupTimeout)
	defer cancel()
	start := time.Now()
	if err := r.Podman.Remove(rctx, id); err != nil {
		if res.Error == "" {
			res.Error = err.Error()
		}
		return
	}
	res.Removed = true
	res.Phases = append(res.Phases, Phase{Name: "remove", Ms: ms(time.Since(start))})
}
