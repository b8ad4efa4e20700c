// Package turn runs one agent turn end to end: lock the task, check the
// seal, prepare the turn (plan.go: gather what the host holds, plan HOME,
// mounts and the sealed spec without side effects, then apply the plan),
// then create → start/attach → wait (with a deadline) → remove. The cage
// is removed on every path out, including errors, deadlines and
// interruption.
package turn

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/containers/podman/v5/pkg/specgen"

	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/dnsseal"
	"github.com/shrooms-cage/shrooms/pkg/engine"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/gateway"
	"github.com/shrooms-cage/shrooms/pkg/history"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/mounts"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/seccomp"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/worktree"
	"github.com/shrooms-cage/shrooms/pkg/worktree/diff"
	"github.com/shrooms-cage/shrooms/pkg/worktree/guard"
)

// Kinds of failure, so the CLI can map them to distinct exit codes (the
// kinds of pkg/fault, under their old names).
var (
	ErrInput        error = fault.Input
	ErrHostNotReady error = fault.HostNotReady
	ErrBusy         error = fault.Busy
	ErrDeadline     error = fault.Deadline
	ErrInterrupted  error = fault.Interrupted
)

// Request is one turn as the caller asks for it.
type Request struct {
	Task     taskid.ID
	Agent    string
	Worktree string
	Args     []string
	// Command, when set, replaces the agent's command (shrooms' own tools,
	// such as the probe, run this way); Args are still appended.
	Command []string
	// ExtraMounts are added to the plan after its own mounts (validated by
	// the caller; e.g. shrooms' own binary, read-only, for the probe).
	ExtraMounts []mounts.Mount
	// Timeout overrides cage.timeout when positive.
	Timeout time.Duration
	// Streams are attached to the cage; a nil Stdin leaves stdin closed.
	Streams podman.Streams
	// Wait is how long the turn waits for a running turn of the task to
	// end before it gives up as busy (run --wait); 0 does not wait.
	Wait time.Duration
	// Terminal gives the cage a terminal (run --tty): Streams are then the
	// person's terminal (Streams.Terminal). Refused unless TIOCSTI is
	// closed (seccomp.TIOCSTIClosed).
	Terminal bool
}

// SealChecker verifies the network seal is in place before a networked cage
// starts; it returns an error unless the installed policy matches cfg. Under
// the allowlist policy it refreshes the seal's resolved host names (unless
// dry) and returns them as "name:address" entries for the cage's /etc/hosts.
// cagenet.Checker is the real one.
type SealChecker func(ctx context.Context, cfg *config.Config, dry bool) (SealState, error)

// ResolverStarter opens a cage's resolver (pkg/dnsseal) in the network
// namespace at nsPath for cfg's policy; the returned function stops it and
// says what it did.
type ResolverStarter func(ctx context.Context, cfg *config.Config, nsPath string) (stop func() dnsseal.Stats, err error)

// SealState is what a seal check found: the allowlist's /etc/hosts entries
// and the digest of the seal verified in the kernel.
type SealState = cagenet.State

// Runner runs turns against one podman service.
type Runner struct {
	Cfg *config.Config
	// Podman is the container engine (*podman.Client outside tests).
	Podman  engine.Engine
	Store   taskstate.Store
	IDFiles taskstate.IDFiles
	// Seal verifies the nftables seal; required when the policy is networked.
	Seal SealChecker
	// Netns makes /run/netns shared in the podman service's mount
	// namespace before a cage on a podman network is created
	// (cagenet.ServiceNetns); required when the policy is networked and
	// network.driver is "podman".
	Netns NetnsSharer
	// Binary is shrooms' own static executable, mounted read-only into
	// prepared cages to hand them their argv (PrepareNext); "" disables them.
	Binary string
	// OnSpec, when set, sees the exact spec sent to podman. Tests use it to
	// record the spec, and to weaken a cage on purpose for negative controls.
	OnSpec func(*specgen.SpecGenerator)
	// BeforeLateRemove, when set, runs in a detached teardown that prepared
	// the next cage, after it dropped the task lock and before it removes
	// the exited cage. Tests hold it there to run turns meanwhile.
	BeforeLateRemove func()
	// CageWall installs the in-cage wall into a networked cage's network
	// namespace before it starts (wall.go; NewRunner sets the real one,
	// InstallCageWall). Required when the policy is networked: without it
	// no networked cage starts. Tests replace it for positive controls;
	// nothing in the config reaches it.
	CageWall CageWaller
	// WatchSeal, when set, watches the seal while a networked cage runs
	// (sealwatch.go; cagenet.Watcher is the real one).
	WatchSeal SealWatcher
	// Detach, when set, takes a turn's teardown off the caller's path once
	// its exit code is known (detach.go).
	Detach Detacher
	// Resolver opens the cage's resolver in its network namespace before
	// the agent starts (cagenet.Resolver is the real one); required when
	// the policy is networked: without it no networked cage starts.
	Resolver ResolverStarter
	// Host is the task HOME and outbox on the host; nil is the real one
	// (loop-mounted volumes, root only). Unit tests set a fake.
	Host Host
	// walkAfter makes the scan after a turn a full walk (tests: the
	// report the events give, compared with the walk's).
	walkAfter bool
	// walkBefore makes the scan before an idmapped turn a full walk
	// (tests: the reference for the namespace's).
	walkBefore bool
}

// NetnsSharer makes /run/netns shared in the mount namespace of the podman
// service at socket (an interface, not a func: the walk's call graph
// resolves a func value to every function of its signature).
type NetnsSharer interface {
	Share(socket string) error
}

// NewRunner returns a runner for cfg with the system's state and id files.
func NewRunner(cfg *config.Config, client engine.Engine, seal SealChecker) *Runner {
	return &Runner{
		Cfg:      cfg,
		Podman:   client,
		Store:    taskstate.Store{Dir: cfg.State.Dir},
		IDFiles:  taskstate.DefaultIDFiles(cfg.Cage.SubIDUser),
		Seal:     seal,
		Netns:    cagenet.ServiceNetns{},
		CageWall: InstallCageWall,
	}
}

// Phase is the duration of one step of the turn.
type Phase struct {
	Name string  `json:"name"`
	Ms   float64 `json:"ms"`
}

// Result is what a turn did, for people and orchestrators (run --json).
type Result struct {
	Task     string `json:"task"`
	Agent    string `json:"agent"`
	Turn     int    `json:"turn"`
	Cage     string `json:"cage,omitempty"`
	CageName string `json:"cageName,omitempty"`
	ExitCode int    `json:"exitCode"`
	Status   string `json:"status"` // exited, deadline, interrupted, seal-lost, error; killed in a record whose shrooms died
	// StartedAt and EndedAt are when shrooms started and ended the turn
	// (RFC 3339, UTC).
	StartedAt string `json:"startedAt"`
	EndedAt   string `json:"endedAt"`
	// OOMKilled is true when the kernel's OOM killer ended a cage process.
	OOMKilled bool    `json:"oomKilled"`
	Error     string  `json:"error,omitempty"`
	Phases    []Phase `json:"phases"`
	TotalMs   float64 `json:"totalMs"`
	Removed   bool    `json:"removed"`
	// Teardown is "detached" when the cage's removal (and the next cage's
	// preparation) continues in a child process, TeardownPID, that holds
	// the task lock until it is done.
	Teardown    string `json:"teardown,omitempty"`
	TeardownPID int    `json:"teardownPid,omitempty"`
	// SealLosses are the times the seal was found missing or changed while
	// the cage ran (and put back, or the cage stopped: status seal-lost).
	SealLosses []SealLoss `json:"sealLosses,omitempty"`
	// Prepared is true when the turn ran in a cage prepared ahead.
	Prepared bool `json:"prepared"`
	// PreparedSkipped says why a prepared cage waiting for this turn was
	// not taken (Skip…: it was removed and the turn ran in a fresh cage).
	PreparedSkipped string `json:"preparedSkipped,omitempty"`
	// Reset is the HOME reset's report for this turn.
	Reset *home.Report `json:"reset,omitempty"`
	// WorktreeGuard says which agent config in the worktree differed from
	// the owner's trusted version and was masked in the cage.
	WorktreeGuard *guard.Check `json:"worktreeGuard,omitempty"`
	// Usage is what the agent asked of its model through the gateway.
	Usage *gateway.Usage `json:"usage,omitempty"`
	// DNS is what the cage's resolver did (networked turns).
	DNS *dnsseal.Stats `json:"dns,omitempty"`
	// History is each provider session's conversation pin in this turn.
	History []history.SessionReport `json:"history,omitempty"`
	// Worktree says who the worktree was given back to after the turn.
	Worktree *worktree.Report `json:"worktree,omitempty"`
	// HomeBytes is the disk space the task HOME takes on the host after the
	// turn (its filesystem image's allocated blocks).
	HomeBytes int64 `json:"homeBytes"`
	// Image is the cage image as podman's store had it at the turn's check.
	Image *podman.Image `json:"image,omitempty"`
	// Runtime is the OCI runtime podman ran the cage with, as its inspect
	// names it (cage.runtime: a name, or the path of a service started
	// with --runtime PATH).
	Runtime string `json:"runtime,omitempty"`
	// RuntimeVersion is that runtime's own version line (`runsc version
	// v0.0.0-…`), as the podman service reports it: set when cage.runtime
	// names a runtime and the cage ran the service's runtime.
	RuntimeVersion string `json:"runtimeVersion,omitempty"`
	// ConfigDigest identifies the configuration the turn ran under
	// (config.Config.Digest).
	ConfigDigest string `json:"configDigest,omitempty"`
	// SealDigest is the digest of the nftables seal verified before a
	// networked cage started ("" under policy none: there is no seal).
	SealDigest string `json:"sealDigest,omitempty"`
	// SealRules is the digest of the rule set the seal check described
	// (both walls are built from it).
	SealRules string `json:"sealRules,omitempty"`
	// CageWall is the in-cage wall verified in the cage's own network
	// namespace before it started (networked policies).
	CageWall *firewall.WallStatus `json:"cageWall,omitempty"`
	// WorktreeChanges is what the turn changed in the worktree.
	WorktreeChanges *WorktreeChanges `json:"worktreeChanges,omitempty"`
	// Outbox is what the turn left in /outbox, moved at its end to the
	// task's pending deliveries (absent when it left nothing).
	Outbox *outbox.Summary `json:"outbox,omitempty"`
}

type clock struct {
	start, last time.Time
	res         *Result
	// starting is held from the turn's start until its cage runs
	// (taskstate.Store.Starting); nil when it could not be taken.
	starting *taskstate.Lock
}

// started releases the turn's starting mark once its cage runs.
func (c *clock) started() { c.starting.Release() }

func (c *clock) lap(name string) {
	now := time.Now()
	c.res.Phases = append(c.res.Phases, Phase{Name: name, Ms: ms(now.Sub(c.last))})
	c.last = now
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Run runs one turn. The error is nil when the agent ran to its own exit,
// whatever its exit code (in Result.ExitCode).
func (r *Runner) Run(ctx context.Context, req Request) (_ *Result, err error) {
	res := &Result{Task: req.Task.String(), Agent: req.Agent, Status: "error", ExitCode: -1, ConfigDigest: r.Cfg.Digest(), StartedAt: taskstate.Now()}
	c := &clock{start: time.Now(), last: time.Now(), res: res}
	defer func() { res.TotalMs, res.EndedAt = ms(time.Since(c.start)), taskstate.Now() }()
	defer c.started()
	// Detached teardowns wait while this turn starts, its checks included
	// (a burst's turns are mostly in them when the first teardowns begin).
	// Nothing is created before the input is checked.
	c.starting, _ = r.Store.StartingEarly()

	steps := runSteps() // a prepared cage it takes is matched in matchSteps
	in, err := r.check(ctx, req, steps)
	if err != nil {
		return res, err
	}
	res.Image, res.SealDigest = &in.image, in.sealDigest
	if in.seal.Rules != nil {
		res.SealRules = in.seal.Rules.Digest()
	}
	c.lap("check")

	// Not marked while it waits for the task's lock: a turn waiting for it
	// marked as starting made the teardown that holds it wait its full 2 s
	// for the turn that waits for it. Marked again once the lock is ours.
	c.started()
	lock, err := in.state.LockWait(req.Wait)
	if err != nil {
		return res, Classify(err)
	}
	defer lock.Release()
	c.starting, _ = r.Store.Starting()
	// Last before the lock goes: HOME is unmounted until the next turn (a
	// failure only leaves it mounted; the next turn or gc releases it).
	// A detached teardown (its own lock, its own release) owns HOME then.
	defer func() {
		if res.Teardown != "detached" {
			_ = r.releaseHome(context.WithoutCancel(ctx), req.Task)
		}
	}()
	var handoff *prepared // a turn whose teardown goes to a detached child
	defer func() {
		if handoff != nil && handoff.detach {
			r.handOff(lock, req.Task, in, handoff, res)
		}
	}()
	// The turn's record, after the worktree is given back, before the lock goes.
	defer func() {
		res.HomeBytes = r.homes().Bytes(req.Task)
		if rerr := r.recordTurn(req.Task, res, err, c.start); rerr != nil && err == nil {
			err = fmt.Errorf("%w: %w", ErrHostNotReady, rerr)
		}
	}()
	var given *worktree.Report // the give-back, when the change scan's walk did it
	if in.worktree != "" {
		// Last before the lock goes: the cage is gone, no turn can start.
		defer func() { err = r.finishWorktree(in.holder, in.worktree, given, res, err) }()
	}
	// First once the turn ends (no process of its cage runs): what it put
	// in /outbox leaves the cages' reach.
	defer r.settleOutbox(context.WithoutCancel(ctx), req.Task, in.state, res)
	c.lap("lock")

	preparedID, prep, err := r.turnCage(ctx, req.Task, in, steps, &res.PreparedSkipped)
	if err != nil {
		return res, err
	}
	res.Prepared = preparedID != ""
	res.Turn = prep.turn
	// Should this shrooms die now, the next command that takes the lock
	// records the turn as killed.
	r.markRunning(in.state, res)
	res.Reset = prep.reset
	res.WorktreeGuard = prep.guard
	c.lap("prepare")

	if r.OnSpec != nil && preparedID == "" {
		r.OnSpec(prep.spec)
	}
	// What the turn changes in the worktree: a scan now, before the cage
	// starts, and one after it ended (on every path out of execute; no
	// process of it runs, even when a detached child removes it later).
	// The scan after reads only what the turn's events name (diff.Watcher):
	// the mark is made now, before anything of the cage can run (a fresh
	// cage is created, a prepared one initialised, neither started) and
	// before the scan below; the hand-over's snapshot was taken before it
	// with no process of the cage running either.
	watch, unwatched := watchWorktree(in.worktree, r.walkAfter)
	defer watch.Close()
	before := prep.before // taken by the hand-over's walk
	if before == nil {
		before = scanWorktree(ctx, in.worktree, res)
	}
	// Nothing of the cage runs before the coarse clock reached the scan
	// before's start (its ctime rule); mostly passed by now.
	if err := before.Ready(); err != nil {
		return res, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	handoff = prep
	res, err = r.execute(ctx, prep, in.streams, c, preparedID)
	if before != nil {
		defer before.Close()
		// The namespace revalidated before the turn, kept for the next
		// one: written now, off the first output's path (a cache: a
		// turn without it lists every directory).
		_ = before.Keep()
		// The events tell all the turn did only once no process of its
		// cage can run: else the old paths, the walk and the full give-back.
		after, why := (*diff.Snapshot)(nil), cageMayRun(res, err)
		switch {
		case watch == nil:
			why = unwatched
		case why == "":
			after, why = watch.After(context.WithoutCancel(ctx), before)
		}
		watch.Close() // before the give-back: its chowns are not the turn's
		stepped := prep.idmap && before.ClockStepped()
		if stepped {
			// The setuid strip's "ctime from the turn's start" cannot
			// hold: every setuid file goes, by the full give-back.
			if serr := r.claims().ClockStepped(in.holder.Idmap); serr != nil && err == nil {
				err = fmt.Errorf("%w: %w", ErrHostNotReady, serr)
			}
		}
		if after != nil && err == nil && prep.idmap && !stepped {
			// An idmapped worktree's give-back needs only what the turn
			// changed; on any doubt finishWorktree's full walk does it.
			given, _ = r.claims().GiveBackChanged(in.holder.Idmap, in.worktree, diff.Changed(before, after))
		}
		scanAfter := "events"
		if after == nil {
			scanAfter = "walk: " + why
			// After a turn that ended cleanly the scan also gives the
			// worktree back; on any other path the give-back stays the
			// last step.
			if err == nil {
				after, given = r.claims().GiveBackScanning(context.WithoutCancel(ctx), in.holder, in.worktree)
			}
		}
		res.WorktreeChanges = worktreeChanges(context.WithoutCancel(ctx), before, after, in.worktree, prep.guard)
		if sum := res.WorktreeChanges.Summary; sum != nil {
			sum.ScanAfter = scanAfter
			sum.ScanBefore, sum.DirsRevalidated, sum.DirsRelisted = before.ScanBefore()
			sum.DirsStatted, sum.DirsStatShared = before.DirsStatted()
		}
	}
	return res, err
}

// turnCage returns the turn's cage plan: a cage prepared ahead for exactly
// this turn (its id; it only needs its argv and the worktree), or a fresh
// preparation in steps after removing any leftover cage of the task.
func (r *Runner) turnCage(ctx context.Context, task taskid.ID, in *checked, s steps, skipped *string) (preparedID string, prep *prepared, err error) {
	if preparedID, prep, *skipped, err = r.takePrepared(ctx, task, in); err != nil {
		return "", nil, err
	}
	if preparedID == "" {
		// A crashed shrooms may have left this task's cage behind; with the
		// lock held no turn of the task runs, so any cage of it is a
		// leftover. A waiting prepared cage was created right after such a
		// sweep under the same lock, and every turn since would have taken
		// or discarded it: when one is taken there is nothing to sweep.
		if _, _, err := r.cages().RemoveLeftovers(ctx, task); err != nil {
			return "", nil, fmt.Errorf("%w: remove leftover cages: %w", ErrHostNotReady, err)
		}
		prep, err = r.prepare(ctx, task, in, s)
		return "", prep, err
	}
	if in.worktree != "" {
		if prep.before, err = r.takeWorktree(ctx, in, prep.Plan, false); err != nil {
			return "", nil, err
		}
	}
	return preparedID, prep, nil
}

// watchWorktree starts recording the worktree's changes (nil without a
// worktree, or when fanotify refuses, with why: the scan after is a full
// walk then).
func watchWorktree(worktree string, walk bool) (*diff.Watcher, string) {
	if worktree == "" {
		return nil, "no worktree"
	}
	if walk {
		return nil, "asked for"
	}
	w, err := diff.Watch(worktree)
	if err != nil {
		return nil, err.Error()
	}
	return w, ""
}

// scanWorktree is the worktree's state before the turn (nil without a
// worktree, or when it cannot be read: res then says why).
func scanWorktree(ctx context.Context, worktree string, res *Result) *diff.Snapshot {
	if worktree == "" {
		return nil
	}
	before, err := diff.Scan(ctx, worktree)
	if err != nil {
		res.WorktreeChanges = &WorktreeChanges{Error: err.Error()}
	}
	return before
}

// WorktreeChanges is what a turn changed in its worktree (diff.Summary),
// or the error that kept it from being known.
type WorktreeChanges struct {
	*diff.Summary
	Error string `json:"error,omitempty"`
}

// worktreeChanges lists what the turn changed (after: the scan after it,
// nil to take one now); check (the turn's guard) adds the files trusted
// config loads or runs to its agent config.
func worktreeChanges(ctx context.Context, before, after *diff.Snapshot, worktree string, check *guard.Check) *WorktreeChanges {
	if after == nil {
		var err error
		if after, err = diff.Scan(ctx, worktree); err != nil {
			return &WorktreeChanges{Error: err.Error()}
		}
	}
	sum := diff.DiffRefs(before, after, check.Referenced)
	if err := before.Err(); err != nil {
		// The namespace's listings, read when first needed, failed: what
		// was there before is unknown, so is what changed.
		return &WorktreeChanges{Error: err.Error()}
	}
	return &WorktreeChanges{Summary: &sum}
}

// Spec returns the spec the next turn of req would run, with no side effects:
// nothing is locked, allocated, created or written.
func (r *Runner) Spec(ctx context.Context, req Request) (*specgen.SpecGenerator, error) {
	steps := specSteps()
	in, err := r.check(ctx, req, steps)
	if err != nil {
		return nil, err
	}
	prep, err := r.prepare(ctx, req.Task, in, steps)
	if err != nil {
		return nil, err
	}
	return prep.spec, nil
}

// checked is a request unpacked, and what check learnt about it: after
// check the turn reads the request only from here.
//
// The task id is not in it: what the turn derives from the id (its state
// directory, its HOME volume's names) is, and the few steps that need the
// id itself (names, labels, the worktree claim, the outbox) take it.
type checked struct {
	// state is the task's directory in the state directory, derived once;
	// dir is its path as the spec's mounts name it.
	state taskstate.Dir
	dir   string
	// home names the task's HOME volume and image, derived once.
	home home.Volume
	// holder is the task as the worktree claims know it (its claims' name,
	// its idmap staging and record paths), derived once.
	holder worktree.Holder
	// agentName is the agent as the request names it, agent its config.
	agentName string
	agent     config.Agent
	// command and args are the request's (Request.Command, Request.Args),
	// extraMounts its extra mounts, streams its streams and terminal
	// whether it runs on a terminal.
	command, args []string
	extraMounts   []mounts.Mount
	streams       podman.Streams
	terminal      bool
	// timeout is the turn's: the request's, or cage.timeout.
	timeout  time.Duration
	tokens   map[string][]byte
	worktree string // cleaned; "" for none
	// sealDigest is the seal verified for a networked cage ("" otherwise).
	sealDigest string
	// seal is the whole seal check's state (its rule set for the wall).
	seal SealState
	// image is the agent's image in podman's store.
	image podman.Image
	// gateway is the agent's model gateway, nil when it has none.
	gateway *gatewayPlan
}

// gatewayPlan is what check learnt about an agent's gateway.
type gatewayPlan struct {
	name     string
	cfg      config.Gateway
	upstream *url.URL
	key      []byte // the real credential: host memory only
	oauth    *gateway.OAuth
	chatgpt  *gateway.ChatGPT
}

// check validates the request and the host: input (task id, agent, paths,
// tokens), the network seal and the image. Bad input is refused before any
// lock, state or volume exists. For `spec` nothing changes; for a turn that
// runs, the seal check may refresh the seal and create the cage network.
func (r *Runner) check(ctx context.Context, req Request, s steps) (*checked, error) {
	cfg := r.Cfg
	in, err := checkInput(cfg, req)
	if err != nil {
		return nil, err
	}
	if in.terminal {
		if err := seccomp.TIOCSTIClosed(cfg.Cage.Seccomp, seccomp.LegacyTIOCSTIKnob); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
	}
	if in.gateway, err = r.checkGateway(ctx, in.agent, s.acquire); err != nil {
		return nil, err
	}
	// The image's inspection, a round trip to podman, runs beside the seal
	// check (netlink, and the network's inspection); read after it.
	image := cfg.ImageFor(in.agent)
	type imageFound struct {
		img podman.Image
		err error
	}
	found := make(chan imageFound, 1)
	go func() {
		img, err := r.Podman.InspectImage(ctx, image)
		found <- imageFound{img, err}
	}()
	if cfg.Network.Networked() {
		if r.Seal == nil {
			return nil, fmt.Errorf("%w: network policy %q needs the nftables seal and this runner cannot verify one; set network.policy = \"none\"", ErrHostNotReady, cfg.Network.Policy)
		}
		if r.Resolver == nil {
			return nil, fmt.Errorf("%w: network policy %q needs the cage's resolver and this runner has none; set network.policy = \"none\"", ErrHostNotReady, cfg.Network.Policy)
		}
		st, err := r.Seal(ctx, cfg, !s.acquire)
		if err != nil {
			return nil, fmt.Errorf("%w: network seal not verified, refusing to start a networked cage: %w", ErrHostNotReady, err)
		}
		in.sealDigest, in.seal = st.Digest, st
		if s.acquire && cfg.Network.Driver == config.DriverPodman {
			// Before any cage on a podman network is created: else podman
			// never tears its network down (cagenet.NetnsShared). Under
			// the shrooms driver podman binds no network namespace.
			if r.Netns == nil {
				return nil, fmt.Errorf("%w: network policy %q needs /run/netns shared in the podman service's mount namespace and this runner cannot check it; set network.policy = \"none\"", ErrHostNotReady, cfg.Network.Policy)
			}
			if err := r.Netns.Share(cfg.Podman.Socket); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
			}
		}
	}
	f := <-found
	if in.image, err = f.img, f.err; err != nil {
		// Only on this path: is it missing, or is podman failing?
		if ok, xerr := r.Podman.ImageExists(ctx, image); xerr == nil && !ok {
			return nil, fmt.Errorf("%w: image %s is not in podman's store (nothing is pulled; build or load it first)", ErrHostNotReady, image)
		}
		return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	return in, nil
}

// checkGateway reads the real key of the agent's gateway (it stays in this
// process) and, for a turn that runs, checks that its upstream accepts
// connections.
func (r *Runner) checkGateway(ctx context.Context, agent config.Agent, preflight bool) (*gatewayPlan, error) {
	if agent.Gateway == "" {
		return nil, nil
	}
	g, ok := r.Cfg.Gateway[agent.Gateway]
	if !ok {
		return nil, fmt.Errorf("%w: unknown gateway %q", ErrInput, agent.Gateway)
	}
	u, err := url.Parse(g.Upstream)
	if err != nil {
		return nil, fmt.Errorf("%w: gateway %s: upstream: %w", ErrInput, agent.Gateway, err)
	}
	plan := &gatewayPlan{name: agent.Gateway, cfg: g, upstream: u}
	if g.Auth == "oauth" {
		// The account's tokens live in the state dir (seeded from the token
		// file at the first turn); only the seed file is checked here.
		if err := r.Cfg.CheckToken(g.Token); err != nil {
			return nil, fmt.Errorf("%w: gateway %s: %w", ErrInput, agent.Gateway, err)
		}
		if err := mounts.CheckHostFile(r.Cfg.Tokens[g.Token], "token "+g.Token); err != nil {
			return nil, fmt.Errorf("%w: gateway %s: %w", ErrInput, agent.Gateway, err)
		}
		plan.oauth = &gateway.OAuth{
			Path:     taskstate.Layout{Dir: r.Cfg.State.Dir}.GatewayCredentials(agent.Gateway),
			Seed:     r.Cfg.Tokens[g.Token],
			TokenURL: cmp.Or(g.TokenURL, gateway.DefaultTokenURL),
			ClientID: cmp.Or(g.ClientID, gateway.DefaultClientID),
		}
	} else if g.Auth == "chatgpt" {
		// Codex's ChatGPT sign-in: the account's tokens live in the state
		// dir, seeded once from the owner's auth.json; the cage gets none.
		if err := mounts.CheckHostFile(r.Cfg.Tokens[g.Token], "token "+g.Token); err != nil {
			return nil, fmt.Errorf("%w: gateway %s: %w", ErrInput, agent.Gateway, err)
		}
		plan.chatgpt = &gateway.ChatGPT{
			Path:     taskstate.Layout{Dir: r.Cfg.State.Dir}.GatewayChatGPT(agent.Gateway),
			Seed:     r.Cfg.Tokens[g.Token],
			TokenURL: cmp.Or(g.TokenURL, gateway.DefaultChatGPTTokenURL),
			ClientID: cmp.Or(g.ClientID, gateway.DefaultChatGPTClientID),
		}
	} else if plan.key, err = readToken(r.Cfg, g.Token); err != nil {
		return nil, fmt.Errorf("%w: gateway %s: %w", ErrInput, agent.Gateway, err)
	}
	if preflight {
		if err := gateway.Preflight(ctx, u); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
	}
	return plan, nil
}

// guardWorktree compares the worktree's agent config with what the owner
// trusted (recorded under the task's directory, taskDir) and plans the
// masks (nil without a worktree). With commit, a task that has no trusted
// record yet records the worktree as it is now: the first turn sees the
// owner's worktree before any cage wrote to it.
func guardWorktree(ctx context.Context, taskDir, worktree string, commit bool) (*guard.Check, error) {
	if worktree == "" {
		return nil, nil
	}
	store := guard.Store{Dir: filepath.Join(taskDir, "trust")}
	m, err := store.Load()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	recorded := false
	if m == nil && commit {
		if _, err := store.Trust(ctx, worktree, nil); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInput, err)
		}
		if m, err = store.Load(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
		recorded = true
	}
	c, err := store.Guard(ctx, worktree, m)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	c.Recorded = recorded
	return c, nil
}

// countTurn records in the task's state st that its next turn starts now,
// with agent on worktree ("" for none).
func countTurn(st taskstate.Dir, agent, worktree string) error {
	if _, err := st.NextTurn(); err != nil {
		return fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if err := st.Remember(taskstate.FactAgent, agent); err != nil {
		return fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if worktree != "" {
		if err := st.Remember(taskstate.FactWorktree, worktree); err != nil {
			return fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
	}
	return nil
}

// hasGit reports whether a worktree has git metadata (.git of any type).
func hasGit(worktree string) bool {
	_, err := os.Lstat(filepath.Join(worktree, ".git"))
	return err == nil
}

// SecretName is the podman secret that carries a task's token.
func SecretName(task taskid.ID, token string) string { return "shrooms-" + task.String() + "-" + token }

// placeholderFile holds a prepared cage's gateway placeholder (root-only):
// the cage's environment was fixed when it was created ahead of its turn.
const placeholderFile = "gateway-placeholder"

// placeholder returns the turn's gateway placeholder: the stored one (in
// the task's directory, taskDir) when matching a prepared cage, a fresh one
// for a turn that starts now or a cage prepared ahead (apply stores it), a
// marker for `spec` (which changes nothing).
func placeholder(taskDir string, from placeholderFrom) (string, error) {
	switch from {
	case placeholderStored:
		b, err := os.ReadFile(filepath.Join(taskDir, placeholderFile))
		if err != nil {
			return "", nil // no prepared placeholder: the prepared cage will not match
		}
		return string(b), nil
	case placeholderFresh:
		ph, err := gateway.NewPlaceholder()
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
		return ph, nil
	}
	return "sk-ant-shrooms-placeholder-(a new one every turn)", nil
}

// readToken reads one token file; its contents are never named in errors.
func readToken(cfg *config.Config, tok string) ([]byte, error) {
	path := cfg.Tokens[tok]
	if err := cfg.CheckToken(tok); err != nil {
		return nil, err
	}
	if err := mounts.CheckHostFile(path, "token "+tok); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("token %s: cannot read %s", tok, path)
	}
	v := strings.TrimRight(string(b), "\r\n")
	if v == "" || len(v) > 64<<10 || strings.ContainsRune(v, 0) || strings.ContainsAny(v, "\r\n") {
		return nil, fmt.Errorf("token %s: %s is empty, over 64 KiB, binary or more than one line", tok, path)
	}
	return []byte(v), nil
}

// readTokens reads the tokens an agent uses; a missing or unreadable file is
// named, its contents never are.
func readTokens(cfg *config.Config, agent config.Agent) (map[string][]byte, error) {
	out := map[string][]byte{}
	names := make([]string, 0, len(agent.TokenEnv))
	for _, tok := range agent.TokenEnv {
		names = append(names, tok)
	}
	sort.Strings(names)
	for _, tok := range names {
		v, err := readToken(cfg, tok)
		if err != nil {
			return nil, err
		}
		out[tok] = v
	}
	return out, nil
}

// Classify gives a failure to take or read a task's state its kind: busy
// stays busy, an invalid task id is bad input, anything else means the host
// is not ready.
func Classify(err error) error {
	if errors.Is(err, taskstate.ErrBusy) {
		return err
	}
	if errors.Is(err, taskid.ErrInvalid) {
		return fmt.Errorf("%w: %w", ErrInput, err)
	}
	return fmt.Errorf("%w: %w", ErrHostNotReady, err)
}

// SpecJSON renders a spec as `shrooms spec` prints it: indented, stable.
func SpecJSON(s *specgen.SpecGenerator) ([]byte, error) {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("render spec: %w", err)
	}
	return append(b, '\n'), nil
}
