// Package turn runs one agent turn end to end, in the order of DESIGN.md's
// data flow: lock the task, check the seal, prepare HOME, plan the mounts,
// build the sealed spec, then create → start/attach → wait (with a deadline)
// → remove. Each step is one call into one package; the cage is removed on
// every path out, including errors, deadlines and interruption.
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

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/engine"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/gateway"
	"github.com/shrooms-cage/shrooms/pkg/gitseal"
	"github.com/shrooms-cage/shrooms/pkg/homereset"
	"github.com/shrooms-cage/shrooms/pkg/mounts"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/seccomp"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/worktreeguard"
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
	Task     string
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
}

// SealChecker verifies the network seal is in place before a networked cage
// starts; it returns an error unless the installed policy matches cfg. Under
// the allowlist policy it refreshes the seal's resolved host names (unless
// dry) and returns them as "name:address" entries for the cage's /etc/hosts.
// cagenet.Checker is the real one.
type SealChecker func(ctx context.Context, cfg *config.Config, dry bool) (hosts []string, err error)

// Runner runs turns against one podman service.
type Runner struct {
	Cfg *config.Config
	// Podman is the container engine (*podman.Client outside tests).
	Podman  engine.Engine
	Store   taskstate.Store
	IDFiles taskstate.IDFiles
	// Seal verifies the nftables seal; required when the policy is networked.
	Seal SealChecker
	// Binary is shrooms' own static executable, mounted read-only into
	// prepared cages to hand them their argv (PrepareNext); "" disables them.
	Binary string
	// OnSpec, when set, sees the exact spec sent to podman. Tests use it to
	// record the spec, and to weaken a cage on purpose for negative controls.
	OnSpec func(*specgen.SpecGenerator)
	// WatchSeal, when set, watches the seal while a networked cage runs
	// (sealwatch.go; cagenet.Watcher is the real one).
	WatchSeal SealWatcher
	// Detach, when set, takes a turn's teardown off the caller's path once
	// its exit code is known (detach.go).
	Detach Detacher
}

// NewRunner returns a runner for cfg with the system's state and id files.
func NewRunner(cfg *config.Config, client engine.Engine, seal SealChecker) *Runner {
	return &Runner{
		Cfg:     cfg,
		Podman:  client,
		Store:   taskstate.Store{Dir: cfg.State.Dir},
		IDFiles: taskstate.DefaultIDFiles(cfg.Cage.SubIDUser),
		Seal:    seal,
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
	Status   string `json:"status"` // exited, deadline, interrupted, seal-lost, error
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
	// Reset is the HOME reset's report for this turn.
	Reset *homereset.Report `json:"reset,omitempty"`
	// WorktreeGuard says which agent config in the worktree differed from
	// the owner's trusted version and was masked in the cage.
	WorktreeGuard *worktreeguard.Check `json:"worktreeGuard,omitempty"`
	// Usage is what the agent asked of its model through the gateway.
	Usage *gateway.Usage `json:"usage,omitempty"`
	// Worktree says who the worktree was given back to after the turn.
	Worktree *WorktreeReport `json:"worktree,omitempty"`
	// HomeBytes is the disk space the task HOME takes on the host after the
	// turn (its filesystem image's allocated blocks).
	HomeBytes int64 `json:"homeBytes"`
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
	res := &Result{Task: req.Task, Agent: req.Agent, Status: "error", ExitCode: -1}
	c := &clock{start: time.Now(), last: time.Now(), res: res}
	defer func() { res.TotalMs = ms(time.Since(c.start)) }()
	// Detached teardowns of other turns wait while this one starts.
	c.starting, _ = r.Store.Starting()
	defer c.started()

	in, err := r.check(ctx, req, false)
	if err != nil {
		return res, err
	}
	c.lap("check")

	lock, err := r.Store.LockTask(in.task)
	if err != nil {
		return res, Classify(err)
	}
	defer lock.Release()
	var handoff *prepared // a turn whose teardown goes to a detached child
	defer func() {
		if handoff != nil && handoff.detach {
			r.handOff(lock, req, handoff, res)
		}
	}()
	// The turn's record, after the worktree is given back, before the lock goes.
	defer func() {
		res.HomeBytes = r.HomeBytes(req.Task)
		if rerr := r.recordTurn(res, err, c.start); rerr != nil && err == nil {
			err = fmt.Errorf("%w: %w", ErrHostNotReady, rerr)
		}
	}()
	if in.worktree != "" {
		// Last before the lock goes: the cage is gone, no turn can start.
		defer func() { err = r.finishWorktree(in.task, in.worktree, res, err) }()
	}
	c.lap("lock")

	// A cage prepared ahead for exactly this turn only needs its argv.
	preparedID, prep, err := r.takePrepared(ctx, req, in)
	if err != nil {
		return res, err
	}
	if preparedID == "" {
		// A crashed shrooms may have left this task's cage behind; with the
		// lock held no turn of the task runs, so any cage of it is a
		// leftover. A waiting prepared cage was created right after such a
		// sweep under the same lock, and every turn since would have taken
		// or discarded it: when one is taken there is nothing to sweep.
		if _, err := r.RemoveLeftovers(ctx, req.Task); err != nil {
			return res, fmt.Errorf("%w: remove leftover cages: %w", ErrHostNotReady, err)
		}
		if prep, err = r.prepare(ctx, req, in, true); err != nil {
			return res, err
		}
	}
	if preparedID != "" && in.worktree != "" {
		if err := r.takeWorktree(req.Task, in.worktree, prep.ids); err != nil {
			return res, err
		}
	}
	res.Prepared = preparedID != ""
	res.Turn = prep.turn
	res.Reset = prep.reset
	res.WorktreeGuard = prep.guard
	c.lap("prepare")

	if r.OnSpec != nil && preparedID == "" {
		r.OnSpec(prep.spec)
	}
	handoff = prep
	return r.execute(ctx, req, prep, c, preparedID)
}

// Spec returns the spec the next turn of req would run, with no side effects:
// nothing is locked, allocated, created or written.
func (r *Runner) Spec(ctx context.Context, req Request) (*specgen.SpecGenerator, error) {
	in, err := r.check(ctx, req, true)
	if err != nil {
		return nil, err
	}
	prep, err := r.prepare(ctx, req, in, false)
	if err != nil {
		return nil, err
	}
	return prep.spec, nil
}

// checked is what check learnt about a request.
type checked struct {
	task     taskid.ID
	agent    config.Agent
	tokens   map[string][]byte
	worktree string   // cleaned; "" for none
	hosts    []string // allowlisted "name:address" entries for /etc/hosts
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
}

// check validates the request and the host without changing anything: input
// (task id, agent, paths, tokens), the network seal and the image. Bad input
// is refused before any lock, state or volume exists.
func (r *Runner) check(ctx context.Context, req Request, dry bool) (*checked, error) {
	cfg := r.Cfg
	in, err := checkInput(cfg, req)
	if err != nil {
		return nil, err
	}
	if in.gateway, err = r.checkGateway(ctx, in.agent, dry); err != nil {
		return nil, err
	}
	if cfg.Network.Networked() {
		if r.Seal == nil {
			return nil, fmt.Errorf("%w: network policy %q needs the nftables seal and this runner cannot verify one; set network.policy = \"none\"", ErrHostNotReady, cfg.Network.Policy)
		}
		if in.hosts, err = r.Seal(ctx, cfg, dry); err != nil {
			return nil, fmt.Errorf("%w: network seal not verified, refusing to start a networked cage: %w", ErrHostNotReady, err)
		}
	}
	image := cfg.ImageFor(in.agent)
	if ok, err := r.Podman.ImageExists(ctx, image); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	} else if !ok {
		return nil, fmt.Errorf("%w: image %s is not in podman's store (nothing is pulled; build or load it first)", ErrHostNotReady, image)
	}
	return in, nil
}

// checkGateway reads the real key of the agent's gateway (it stays in this
// process) and, unless dry, checks that its upstream accepts connections.
func (r *Runner) checkGateway(ctx context.Context, agent config.Agent, dry bool) (*gatewayPlan, error) {
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
		if err := mounts.CheckHostFile(r.Cfg.Tokens[g.Token], "token "+g.Token); err != nil {
			return nil, fmt.Errorf("%w: gateway %s: %w", ErrInput, agent.Gateway, err)
		}
		plan.oauth = &gateway.OAuth{
			Path:     filepath.Join(r.Cfg.State.Dir, "gateway", agent.Gateway, "credentials.json"),
			Seed:     r.Cfg.Tokens[g.Token],
			TokenURL: cmp.Or(g.TokenURL, gateway.DefaultTokenURL),
			ClientID: cmp.Or(g.ClientID, gateway.DefaultClientID),
		}
	} else if plan.key, err = readToken(r.Cfg, g.Token); err != nil {
		return nil, fmt.Errorf("%w: gateway %s: %w", ErrInput, agent.Gateway, err)
	}
	if !dry {
		if err := gateway.Preflight(ctx, u); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
	}
	return plan, nil
}

// CheckWorktree validates a worktree path and returns it cleaned.
func (r *Runner) CheckWorktree(path string) (string, error) { return worktreePath(r.Cfg, path) }

type prepared struct {
	// argv is a prepared cage's command line, handed over at its run.
	argv []string
	// secrets are the podman secrets holding this turn's tokens, removed
	// once the cage is gone so no copy outlives the turn.
	secrets []string
	turn    int
	spec    *specgen.SpecGenerator
	ids     taskstate.IDs
	root    string // the HOME volume's host directory
	reset   *homereset.Report
	guard   *worktreeguard.Check
	// gateway is the turn's model gateway configuration, its placeholder
	// included (nil without one); execute starts it in the cage's netns.
	gateway *gateway.Config
	// detach is set once the turn's exit code is known and Runner.Detach
	// will take the teardown.
	detach bool
}

// prepare lays out the cage's host side and computes its spec. With commit
// false it changes nothing (for `spec`). With commit true it allocates the
// task's ids, bootstraps HOME on a first turn, resets HOME to the baseline
// and keep-list, writes the managed policy, mounts the outbox, hands the
// worktree to the task's user, stores token secrets and counts the turn.
func (r *Runner) prepare(ctx context.Context, req Request, in *checked, commit bool) (*prepared, error) {
	return r.prepareAs(ctx, req, in, commit, false)
}

// prepareAs is prepare; with ahead it computes the spec of a cage created
// before its run (see PrepareNext): its argv comes from a file written when
// the run starts, and the turn is counted only then.
func (r *Runner) prepareAs(ctx context.Context, req Request, in *checked, commit, ahead bool) (*prepared, error) {
	cfg := r.Cfg
	ids, err := r.Store.TaskIDs(in.task, r.IDFiles, commit)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	turn, err := r.Store.LastTurn(in.task)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	turn++
	p := &prepared{turn: turn, ids: ids}
	agentUID, agentGID := int(ids.UID)+int(cfg.Cage.User), int(ids.GID)+int(cfg.Cage.User)
	taskDir := filepath.Join(cfg.State.Dir, "tasks", req.Task)

	// HOME: bootstrap once, then reset to baseline + keep-list every turn.
	var policy []homereset.PolicyMount
	outboxDir := filepath.Join(cfg.Outbox.Root, req.Task)
	var gitMounts []mounts.Mount
	if commit {
		if p.root, _, err = r.bootstrap(ctx, req.Task, ids, in.agent.Home); err != nil {
			return nil, err
		}
		if p.reset, err = homereset.Reset(ctx, homereset.ResetInput{Task: r.HomeTask(p.root, ids, in.agent.Home)}); err != nil {
			return nil, fmt.Errorf("%w: HOME reset failed, the turn does not start: %w", ErrHostNotReady, err)
		}
		var pg homereset.PolicyGateway
		if in.gateway != nil {
			pg.AnthropicBaseURL = gateway.BaseURL()
		}
		if policy, err = homereset.WritePolicyWith(filepath.Join(taskDir, "policy"), cfg, in.agent.Home, pg); err != nil {
			return nil, fmt.Errorf("%w: managed policy: %w", ErrHostNotReady, err)
		}
		if outboxDir, err = outbox.Prepare(cfg.Outbox.Root, req.Task, agentUID, agentGID, outbox.LimitsFrom(cfg.Outbox)); err != nil {
			return nil, fmt.Errorf("%w: outbox: %w", ErrHostNotReady, err)
		}
		if in.worktree != "" && hasGit(in.worktree) {
			if gitMounts, err = gitseal.CageMounts(in.worktree, cfg.State.Dir); err != nil {
				return nil, fmt.Errorf("%w: git metadata: %w", ErrInput, err)
			}
		}
	} else {
		if p.root, err = r.Home().Root(ctx, req.Task); err != nil {
			return nil, err
		}
		policy = homereset.PolicyMounts(filepath.Join(taskDir, "policy"), in.agent.Home)
		if in.worktree != "" && hasGit(in.worktree) {
			if gitMounts, err = gitseal.PlanCageMounts(in.worktree, cfg.State.Dir); err != nil {
				return nil, fmt.Errorf("%w: git metadata: %w", ErrInput, err)
			}
		}
	}

	plan, err := mounts.Build(mounts.Input{
		Task:      in.task,
		Worktree:  in.worktree,
		HomeDir:   homereset.HomeDir(p.root),
		OutboxDir: outboxDir,
		TmpSize:   int64(cfg.Cage.TmpSize),
		RunSize:   int64(cfg.Cage.RunSize),
		TmpExec:   cfg.Cage.TmpExec,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	for _, m := range policy {
		plan.Mounts = append(plan.Mounts, mounts.Mount{Kind: mounts.Bind, Source: m.Source, Dest: m.Dest, ReadOnly: true, Options: []string{"rbind", "nosuid", "nodev", "noexec"}})
	}
	plan.Mounts = append(plan.Mounts, gitMounts...)
	if p.guard, err = r.guardWorktree(ctx, req.Task, in.worktree, commit); err != nil {
		return nil, err
	}
	shroomsEnv := map[string]string{}
	guardDigest := ""
	if p.guard != nil {
		plan.Mounts = append(plan.Mounts, p.guard.Mounts...)
		guardDigest = p.guard.Digest
	}
	if in.gateway != nil {
		ph, err := r.placeholder(taskDir, commit, ahead)
		if err != nil {
			return nil, err
		}
		p.gateway = &gateway.Config{
			API: in.gateway.cfg.API, Upstream: in.gateway.upstream, Key: in.gateway.key, OAuth: in.gateway.oauth, Placeholder: ph,
			MaxRequests: in.gateway.cfg.MaxRequests, MaxOutputTokens: in.gateway.cfg.MaxOutputTokens,
		}
		// The agent talks to the gateway on its own loopback, with a
		// placeholder that is worthless anywhere else.
		shroomsEnv["ANTHROPIC_BASE_URL"] = gateway.BaseURL()
		if in.gateway.oauth == nil {
			shroomsEnv["ANTHROPIC_API_KEY"] = ph
		} else if commit {
			// A subscription sign-in: the cage's .credentials.json holds the
			// placeholder as its access token, no refresh token, and an
			// expiry the agent never reaches.
			creds, err := in.gateway.oauth.CageCredentials(ctx, ph)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInput, err)
			}
			if err := homereset.PlaceFile(p.root, ".claude/.credentials.json", creds, 0o600, agentUID, agentGID); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
			}
		}
	}
	if p.guard == nil || !p.guard.OpencodeProjectConfig {
		// Second wall behind the masks: opencode skips project config
		// (opencode.json, .opencode/, AGENTS.md) unless the owner trusted
		// some and all of it is unchanged.
		shroomsEnv["OPENCODE_DISABLE_PROJECT_CONFIG"] = "1"
	}
	plan.Mounts = append(plan.Mounts, req.ExtraMounts...)
	command, args := req.Command, req.Args
	if ahead {
		if r.Binary == "" {
			return nil, fmt.Errorf("%w: prepared cages need shrooms' own binary (Runner.Binary)", ErrHostNotReady)
		}
		plan.Mounts = append(plan.Mounts,
			mounts.Mount{Kind: mounts.Bind, Source: r.Binary, Dest: CageBinary, ReadOnly: true, Options: []string{"rbind", "nosuid", "nodev"}},
			mounts.Mount{Kind: mounts.Bind, Source: filepath.Join(taskDir, "argv"), Dest: CageArgv, ReadOnly: true, Options: []string{"rbind", "nosuid", "nodev", "noexec"}})
		full := in.agent.Command
		if len(req.Command) > 0 {
			full = req.Command
		}
		p.argv = append(append([]string{}, full...), req.Args...)
		command, args = []string{CageBinary, "cage-exec", CageArgv}, nil
	}

	seccompPath := ""
	switch cfg.Cage.Seccomp {
	case "podman":
	case "shrooms":
		seccompPath = seccomp.Path(cfg.State.Dir)
		if commit {
			if _, err := seccomp.Install(cfg.State.Dir); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
			}
		}
	default:
		seccompPath = cfg.Cage.Seccomp
	}

	timeout := r.timeout(req)
	secretEnv := map[string]string{}
	secrets := map[string][]byte{}
	for env, tok := range in.agent.TokenEnv {
		name := SecretName(req.Task, tok)
		secretEnv[env] = name
		secrets[name] = in.tokens[tok]
	}
	p.spec, err = sealed.Spec(cfg, sealed.Turn{
		Task:            req.Task,
		Number:          turn,
		Agent:           req.Agent,
		Command:         command,
		Args:            args,
		Stdin:           req.Streams.Stdin != nil,
		IDs:             sealed.IDRange{UID: ids.UID, GID: ids.GID, Size: taskstate.SlotSize},
		Plan:            plan,
		SecretEnv:       secretEnv,
		HostEntries:     in.hosts,
		SeccompPath:     seccompPath,
		DeadlineSeconds: uint(timeout.Seconds()) + uint(cfg.Cage.StopGrace.Std().Seconds()) + 30,
		Env:             shroomsEnv,
		WorktreeGuard:   guardDigest,
	})
	if err != nil {
		return nil, err
	}
	if !commit {
		return p, nil
	}

	// A cage prepared ahead takes the worktree when its turn runs, so the
	// owner keeps it between turns.
	if in.worktree != "" && !ahead {
		if err := r.takeWorktree(req.Task, in.worktree, ids); err != nil {
			return nil, err
		}
	}
	for name, value := range secrets {
		if err := r.Podman.PutSecret(ctx, name, value, map[string]string{sealed.LabelTask: req.Task}); err != nil {
			r.removeSecrets(p.secrets)
			return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
		p.secrets = append(p.secrets, name)
	}
	if ahead {
		if err := writeArgvFile(filepath.Join(taskDir, "argv"), nil); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
		return p, nil
	}
	if err := r.countTurn(req, in); err != nil {
		return nil, err
	}
	return p, nil
}

// TrustStore is the task's store of trusted worktree config.
func (r *Runner) TrustStore(task string) worktreeguard.Store {
	return worktreeguard.Store{Dir: filepath.Join(r.TaskDir(task), "trust")}
}

// guardWorktree compares the worktree's agent config with what the owner
// trusted and plans the masks (nil without a worktree). With commit, a task
// that has no trusted record yet records the worktree as it is now: the
// first turn sees the owner's worktree before any cage wrote to it.
func (r *Runner) guardWorktree(ctx context.Context, task, worktree string, commit bool) (*worktreeguard.Check, error) {
	if worktree == "" {
		return nil, nil
	}
	store := r.TrustStore(task)
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

// countTurn records that the task's next turn starts now.
func (r *Runner) countTurn(req Request, in *checked) error {
	if _, err := r.Store.NextTurn(in.task); err != nil {
		return fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if err := r.Store.Remember(in.task, taskstate.FactAgent, req.Agent); err != nil {
		return fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if in.worktree != "" {
		if err := r.Store.Remember(in.task, taskstate.FactWorktree, in.worktree); err != nil {
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

func (r *Runner) timeout(req Request) time.Duration {
	if req.Timeout > 0 {
		return req.Timeout
	}
	return r.Cfg.Cage.Timeout.Std()
}

// SecretName is the podman secret that carries a task's token.
func SecretName(task, token string) string { return "shrooms-" + task + "-" + token }

// placeholderFile holds a prepared cage's gateway placeholder (root-only):
// the cage's environment was fixed when it was created ahead of its turn.
const placeholderFile = "gateway-placeholder"

// placeholder returns the turn's gateway placeholder: a fresh one for a
// turn that starts now, the stored one for a prepared cage, a marker for
// `spec` (which changes nothing).
func (r *Runner) placeholder(taskDir string, commit, ahead bool) (string, error) {
	path := filepath.Join(taskDir, placeholderFile)
	switch {
	case ahead && !commit:
		b, err := os.ReadFile(path)
		if err != nil {
			return "", nil // no prepared placeholder: the prepared cage will not match
		}
		return string(b), nil
	case commit:
		ph, err := gateway.NewPlaceholder()
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
		if ahead {
			if err := os.WriteFile(path, []byte(ph), 0o600); err != nil {
				return "", fmt.Errorf("%w: gateway placeholder: %w", ErrHostNotReady, err)
			}
		}
		return ph, nil
	}
	return "sk-ant-shrooms-placeholder-(a new one every turn)", nil
}

// readToken reads one token file; its contents are never named in errors.
func readToken(cfg *config.Config, tok string) ([]byte, error) {
	path := cfg.Tokens[tok]
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

// Bootstrap creates the task HOME once, under the task lock, seeding the
// credentials of the given HOME profiles (all profiles when none are given).
func (r *Runner) Bootstrap(ctx context.Context, name string, profiles []string) (*homereset.BootstrapResult, error) {
	task, err := taskid.Parse(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	if len(profiles) == 0 {
		profiles = config.HomeProfiles
	}
	lock, err := r.Store.LockTask(task)
	if err != nil {
		return nil, Classify(err)
	}
	defer lock.Release()
	ids, err := r.Store.TaskIDs(task, r.IDFiles, true)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	_, res, err := r.bootstrap(ctx, name, ids, profiles)
	return res, err
}
