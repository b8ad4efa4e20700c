package turn

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containers/podman/v5/pkg/specgen"

	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/gateway"
	"github.com/shrooms-cage/shrooms/pkg/gitseal"
	"github.com/shrooms-cage/shrooms/pkg/history"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/mounts"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/profile"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/seccomp"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/worktree/diff"
	"github.com/shrooms-cage/shrooms/pkg/worktree/guard"
)

// A turn is prepared in three steps, as podman's specgen keeps computing a
// spec apart from executing it: gather reads (or, for a turn that runs,
// acquires) what the plan needs from the host; plan computes everything the
// turn will do without side effects; apply does it. `spec`, run, PrepareNext
// and the match of a prepared cage differ only in their steps, chosen once
// by each (specSteps, runSteps, aheadSteps, matchSteps).

// steps is what preparing a turn does: check, gather, plan and apply ask
// these named choices instead of which command prepares the turn.
type steps struct {
	// acquire: the turn changes the host: check may refresh the seal and
	// asks the gateway's upstream, gather allocates the task's ids, opens
	// (bootstrapping) HOME and records the worktree's trust, apply runs.
	acquire bool
	// ahead: the cage is one created ahead of its run; its argv comes from
	// a file written when the run starts (plan).
	ahead bool
	// takeWorktree: apply hands the worktree to the task's user now (a cage
	// prepared ahead takes it when its turn runs).
	takeWorktree bool
	// record: apply writes what the run that takes the cage checks (the
	// outbox's device, the gateway placeholder, the argv file) instead of
	// counting the turn, which is counted only when it runs.
	record bool
	// placeholder is where the gateway placeholder comes from.
	placeholder placeholderFrom
}

// placeholderFrom is where a turn's gateway placeholder comes from.
type placeholderFrom int

const (
	// placeholderMarker is `spec`'s: a marker, nothing made.
	placeholderMarker placeholderFrom = iota
	// placeholderFresh is a new one (a turn that starts now, a cage
	// prepared ahead: apply stores it).
	placeholderFresh
	// placeholderStored is the one a prepared cage was given (its match).
	placeholderStored
)

// specSteps are `spec`'s: nothing is allocated, written or counted.
func specSteps() steps { return steps{placeholder: placeholderMarker} }

// runSteps are those of a turn that starts now.
func runSteps() steps {
	return steps{acquire: true, takeWorktree: true, placeholder: placeholderFresh}
}

// aheadSteps are those of a cage created before its turn is asked for
// (PrepareNext).
func aheadSteps() steps {
	return steps{acquire: true, ahead: true, record: true, placeholder: placeholderFresh}
}

// matchSteps plan what a prepared cage must match; read only.
func matchSteps() steps { return steps{ahead: true, placeholder: placeholderStored} }

// facts is what a plan needs from the host.
type facts struct {
	ids  taskstate.IDs
	turn int
	// root is the HOME volume's host directory.
	root  string
	guard *guard.Check
	// placeholder is the gateway placeholder ("" without a gateway).
	placeholder string
	// kept are the task's other HOME profiles, whose kept state stays.
	kept []string
}

// Plan is everything a turn will do, computed without side effects.
type Plan struct {
	// turn is the task's turn number; the task itself is the checked
	// request's, which is where what needs it reads it.
	turn int
	// name is the cage's (sealed.Name), timeout the turn's.
	name     string
	timeout  time.Duration
	ids      taskstate.IDs
	worktree string // cleaned; "" for none
	// idmap says the cage gets the worktree through an idmapped mount
	// (pkg/worktree's idmap.go: no chown walks); idmapOff says why not.
	idmap    bool
	idmapOff string
	staging  string // the idmapped worktree's staging mount
	// root is the HOME volume's host directory; home is it for the reset.
	root string
	home home.Task
	// policy is the managed policy, git the worktree's git metadata,
	// gitConfig the cage's system git configuration.
	policy    *home.Policy
	git       gitseal.CagePlan
	gitConfig gitseal.SystemConfig
	// outbox is the task's outbox directory, mounted size-capped by apply.
	outbox string
	// seccomp says whether shrooms' seccomp profile is installed.
	seccomp bool
	// resolvConf is the cage's resolv.conf to install (network.driver
	// "shrooms"; "" for none).
	resolvConf string
	guard      *guard.Check
	// gateway is the turn's model gateway configuration, its placeholder
	// included (nil without one); execute starts it in the cage's netns.
	gateway *gateway.Config
	// oauth is set when the cage gets subscription credentials holding the
	// placeholder, at the HOME path signIn.
	oauth  *gateway.OAuth
	signIn string
	// secrets are the podman secrets of the turn's tokens, by name.
	secrets map[string][]byte
	// argv is a prepared cage's command line, handed over at its run.
	argv []string
	// seal is the seal check's state: the rule set the cage's in-cage
	// wall is built from (wall.go).
	seal SealState
	spec *specgen.SpecGenerator
}

// prepared is a plan applied: what execute needs of it.
type prepared struct {
	*Plan
	// secrets are the podman secrets holding this turn's tokens, removed
	// once the cage is gone so no copy outlives the turn.
	secrets []string
	reset   *home.Report
	// image is the id of the image a prepared cage was created from.
	image string
	// runtime is the OCI runtime podman runs the cage with (its inspect).
	runtime string
	// pid is the host pid of the initialised cage's process once known
	// (a prepared cage's inspection, or cagePid): 0 until then.
	pid int
	// before is the worktree as the hand-over left it (nil: scan it).
	before *diff.Snapshot
	// detach is set once the turn's exit code is known and Runner.Detach
	// will take the teardown.
	detach bool
}

// prepare plans the turn of in in steps s and, when s acquire, applies it:
// allocates the task's ids, bootstraps HOME on a first turn, resets HOME to
// the baseline and keep-list, writes the managed policy, mounts the outbox,
// hands the worktree to the task's user, stores token secrets and counts
// the turn.
func (r *Runner) prepare(ctx context.Context, task taskid.ID, in *checked, s steps) (*prepared, error) {
	f, err := r.gather(ctx, task, in, s)
	if err != nil {
		return nil, err
	}
	p, err := r.plan(task, in, f, s.ahead)
	if err != nil {
		return nil, err
	}
	if !s.acquire {
		return &prepared{Plan: p}, nil
	}
	return r.apply(ctx, task, in, p, s)
}

// gather reads what the plan needs from the host; when s acquire, it also
// acquires it: the task's ids are allocated, HOME is opened (bootstrapped
// once), a first turn records the worktree's agent config as trusted, and
// the gateway gets a fresh placeholder.
func (r *Runner) gather(ctx context.Context, task taskid.ID, in *checked, s steps) (*facts, error) {
	ids, err := r.Store.IDsOf(in.state, r.IDFiles, s.acquire)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	last, err := in.state.LastTurn()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	f := &facts{ids: ids, turn: last + 1}
	if f.kept, err = home.KeptProfiles(r.Cfg, in.state, in.agent.Home); err != nil {
		return nil, err
	}
	if s.acquire {
		f.root, _, err = r.bootstrap(ctx, task, in.home, in.state, ids, in.agent.Home)
		if err == nil {
			err = home.RememberProfiles(in.state, in.agent.Home, f.kept)
		}
	} else {
		f.root, err = r.host().HomeRoot(ctx, in.home)
	}
	if err != nil {
		return nil, err
	}
	if f.guard, err = guardWorktree(ctx, in.dir, in.worktree, s.acquire); err != nil {
		return nil, err
	}
	if in.gateway != nil {
		if f.placeholder, err = placeholder(in.dir, s.placeholder); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// plan computes the turn from the checked request and the host facts,
// changing nothing.
func (r *Runner) plan(task taskid.ID, in *checked, f *facts, ahead bool) (*Plan, error) {
	cfg := r.Cfg
	p := &Plan{
		turn: f.turn, name: sealed.Name(task, f.turn), timeout: in.timeout,
		ids: f.ids, worktree: in.worktree, root: f.root, guard: f.guard,
		home:   r.homeTask(f.root, f.ids, in.agent.Home, f.kept),
		outbox: filepath.Join(filepath.Clean(cfg.Outbox.Root), task.String()),
		seal:   in.seal,
	}
	var pg home.PolicyGateway
	if in.gateway != nil {
		switch in.gateway.cfg.API {
		case "openai":
			pg.OpenAIBaseURL = gateway.BaseURL()
		case "gemini":
			pg.GeminiBaseURL = gateway.BaseURL()
		default:
			pg.AnthropicBaseURL = gateway.BaseURL()
		}
	}
	var err error
	if p.policy, err = home.PlanPolicy(filepath.Join(in.dir, "policy"), cfg, in.agent.Home, pg); err != nil {
		return nil, fmt.Errorf("%w: managed policy: %w", ErrHostNotReady, err)
	}
	if p.gitConfig, err = gitseal.PlanSystemConfig(cfg.State.Dir); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if in.worktree != "" && hasGit(in.worktree) {
		if p.git, err = gitseal.PlanCage(in.worktree, cfg.State.Dir); err != nil {
			return nil, fmt.Errorf("%w: git metadata: %w", ErrInput, err)
		}
	}
	if in.worktree != "" {
		p.idmapOff = r.claims().IdmapReason(in.holder, in.worktree, p.ids)
		if p.idmap = p.idmapOff == ""; p.idmap {
			p.staging = in.holder.Idmap.StagingDir()
		}
	}
	mp, err := r.planMounts(in.worktree, in.extraMounts, p)
	if err != nil {
		return nil, err
	}
	env := r.planGateway(in.gateway, in.agent.Home, in.state, p, f.placeholder)
	command, args, err := r.planCommand(in.agent.Command, in.command, in.args, filepath.Join(in.dir, "argv"), p, mp, ahead)
	if err != nil {
		return nil, err
	}
	seccompPath := r.planSeccomp(p)
	if cfg.Network.Networked() && cfg.Network.Driver == config.DriverShrooms {
		p.resolvConf = cagenet.ResolvConfPath(cfg.State.Dir)
	}
	secretEnv := map[string]string{}
	p.secrets = map[string][]byte{}
	for env, tok := range in.agent.TokenEnv {
		name := SecretName(task, tok)
		secretEnv[env] = name
		p.secrets[name] = in.tokens[tok]
	}
	guardDigest := ""
	if p.guard != nil {
		guardDigest = p.guard.Digest
	}
	p.spec, err = sealed.Spec(cfg, sealed.Turn{
		Task:            task,
		Number:          p.turn,
		Agent:           in.agentName,
		Command:         command,
		Args:            args,
		Stdin:           in.streams.Stdin != nil,
		Terminal:        in.terminal,
		IDs:             sealed.IDRange{UID: p.ids.UID, GID: p.ids.GID, Size: taskstate.SlotSize},
		Plan:            mp,
		SecretEnv:       secretEnv,
		SeccompPath:     seccompPath,
		ResolvConf:      p.resolvConf,
		DeadlineSeconds: uint(p.timeout.Seconds()) + uint(cfg.Cage.StopGrace.Std().Seconds()) + 30,
		Env:             env,
		WorktreeGuard:   guardDigest,
		GVisor:          gvisor(cfg.Cage.Runtime),
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// planMounts is the cage's mount plan: /work, HOME, the outbox and the
// tmpfs mounts, then the managed policy, the git metadata, the worktree
// guard's masks and the request's extra mounts (extra).
func (r *Runner) planMounts(worktree string, extra []mounts.Mount, p *Plan) (*mounts.Plan, error) {
	cfg := r.Cfg
	mp, err := mounts.Build(mounts.Input{
		Worktree:  worktree,
		HomeDir:   home.Dir(p.root),
		Staging:   p.staging,
		OutboxDir: p.outbox,
		TmpSize:   int64(cfg.Cage.TmpSize),
		RunSize:   int64(cfg.Cage.RunSize),
		TmpExec:   cfg.Cage.TmpExec,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	for _, m := range p.policy.Mounts {
		mp.Mounts = append(mp.Mounts, mounts.Mount{Kind: mounts.Bind, Source: m.Source, Dest: m.Dest, ReadOnly: true, Options: []string{"rbind", "nosuid", "nodev", "noexec"}})
	}
	mp.Mounts = append(mp.Mounts, p.gitConfig.Mount())
	mp.Mounts = append(mp.Mounts, p.git.Mounts...)
	if p.guard != nil {
		mp.Mounts = append(mp.Mounts, p.guard.Mounts...)
	}
	mp.Mounts = append(mp.Mounts, extra...)
	return mp, nil
}

// planGateway plans the turn's model gateway g (nil: none) for an agent
// whose HOME profiles are profiles and returns the environment shrooms sets
// in the cage; the history pins are in the task's state st.
func (r *Runner) planGateway(g *gatewayPlan, profiles []string, st taskstate.Dir, p *Plan, placeholder string) map[string]string {
	env := map[string]string{}
	if g != nil {
		p.gateway = &gateway.Config{
			API: g.cfg.API, Upstream: g.upstream, Key: g.key, OAuth: g.oauth, ChatGPT: g.chatgpt, Placeholder: placeholder,
			MaxRequests: g.cfg.MaxRequests, MaxOutputTokens: g.cfg.MaxOutputTokens,
			Policy: gateway.Policy{AllowBetas: g.cfg.AllowBetas, AllowServerTools: g.cfg.AllowServerTools},
		}
		if mode := history.Mode(g.cfg.History); mode != history.Off {
			// The pins live in the task's state, never in a cage; the
			// tracker reads them when the turn's first request comes.
			p.gateway.History = history.NewTracker(st.History(), mode)
		}
		// The agent talks to the gateway on its own loopback, with a
		// placeholder that is worthless anywhere else.
		switch {
		case g.cfg.API == "openai":
			// Codex reads the placeholder through the provider the
			// managed config pins (env_key); other OpenAI clients from
			// these two.
			env["OPENAI_BASE_URL"] = gateway.BaseURL() + "/v1"
			env["OPENAI_API_KEY"] = placeholder
		case g.cfg.API == "gemini":
			// Gemini CLI sends GEMINI_API_KEY as x-goog-api-key to this
			// base URL (the system settings pin the API-key sign-in).
			env["GOOGLE_GEMINI_BASE_URL"] = gateway.BaseURL()
			env["GEMINI_API_KEY"] = placeholder
		case g.oauth == nil:
			env["ANTHROPIC_BASE_URL"] = gateway.BaseURL()
			env["ANTHROPIC_API_KEY"] = placeholder
			// Approved in ~/.claude.json by the reset: an interactive
			// Claude Code would ask, and its default answer turns the
			// gateway off.
			p.home.APIKey = placeholder
		default:
			// A subscription sign-in: apply places credentials holding the
			// placeholder in HOME.
			env["ANTHROPIC_BASE_URL"] = gateway.BaseURL()
			p.oauth = g.oauth
			p.signIn = profile.SignInPath(profiles)
		}
	}
	if p.guard == nil || !p.guard.OpencodeProjectConfig {
		// Second wall behind the masks: opencode skips project config
		// (opencode.json, .opencode/, AGENTS.md) unless the owner trusted
		// some and all of it is unchanged.
		env["OPENCODE_DISABLE_PROJECT_CONFIG"] = "1"
	}
	return env
}

// planCommand returns the cage's command and arguments: the request's
// command (the agent's, agentCmd, when it names none) and args. A cage
// prepared ahead runs shrooms' own binary, which reads the argv handed
// over at the run from a mounted file (argvFile, in the task's directory).
func (r *Runner) planCommand(agentCmd, command, args []string, argvFile string, p *Plan, mp *mounts.Plan, ahead bool) ([]string, []string, error) {
	if !ahead {
		return command, args, nil
	}
	if r.Binary == "" {
		return nil, nil, fmt.Errorf("%w: prepared cages need shrooms' own binary (Runner.Binary)", ErrHostNotReady)
	}
	mp.Mounts = append(mp.Mounts,
		mounts.Mount{Kind: mounts.Bind, Source: r.Binary, Dest: CageBinary, ReadOnly: true, Options: []string{"rbind", "nosuid", "nodev"}},
		mounts.Mount{Kind: mounts.Bind, Source: argvFile, Dest: CageArgv, ReadOnly: true, Options: []string{"rbind", "nosuid", "nodev", "noexec"}})
	full := agentCmd
	if len(command) > 0 {
		full = command
	}
	p.argv = append(append([]string{}, full...), args...)
	return []string{CageBinary, "cage-exec", CageArgv}, nil, nil
}

// gvisor says whether cage.runtime is gVisor's runsc: its cages get
// seccomp.ProfileFor(true). Only such cages run it — a cage whose runtime is
// not cage.runtime is refused before it starts.
func gvisor(runtime string) bool { return filepath.Base(runtime) == "runsc" }

// planSeccomp returns the seccomp profile's path ("" for podman's default).
func (r *Runner) planSeccomp(p *Plan) string {
	switch r.Cfg.Cage.Seccomp {
	case "podman":
		return ""
	case "shrooms":
		p.seccomp = true
		return seccomp.PathFor(r.Cfg.State.Dir, gvisor(r.Cfg.Cage.Runtime))
	}
	return r.Cfg.Cage.Seccomp
}

// apply does what the plan says, in the order a turn needs it: HOME and
// the managed policy, the outbox, the other host files the cage sees, the
// worktree, the secrets, and last the argv file (ahead) or the turn's
// count.
func (r *Runner) apply(ctx context.Context, task taskid.ID, in *checked, p *Plan, s steps) (*prepared, error) {
	out := &prepared{Plan: p}
	if err := r.applyHome(ctx, out); err != nil {
		return nil, err
	}
	// The turn's empty outbox (what the task's last turn left in it, a
	// killed turn's say, goes to its pending delivery first); a cage
	// prepared ahead records which tmpfs it was given.
	dev, err := r.host().PrepareOutbox(ctx, r.Cfg.Outbox.Root, task, p.turn-1, p.home.UID, p.home.GID, outbox.LimitsFrom(r.Cfg.Outbox))
	if err == nil && s.record {
		err = recordOutbox(in.dir, dev)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: outbox: %w", ErrHostNotReady, err)
	}
	if err := r.applyFiles(ctx, in.dir, out, s); err != nil {
		return nil, err
	}
	// A cage prepared ahead takes the worktree when its turn runs, so the
	// owner keeps it between turns.
	if in.worktree != "" && s.takeWorktree {
		before, err := r.takeWorktree(ctx, in, p, true)
		if err != nil {
			return nil, err
		}
		out.before = before
	} else if in.worktree != "" && p.idmap {
		// The cage prepared ahead binds the staging mount at its init.
		if err := r.claims().PrepareIdmapped(ctx, in.holder, in.worktree, p.ids); err != nil {
			return nil, fmt.Errorf("%w: idmapped worktree: %w", ErrHostNotReady, err)
		}
	}
	for name, value := range p.secrets {
		if err := r.Podman.PutSecret(ctx, name, value, map[string]string{sealed.LabelTask: task.String()}); err != nil {
			r.removeSecrets(out.secrets)
			return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
		out.secrets = append(out.secrets, name)
	}
	if s.record {
		if err := writeArgvFile(filepath.Join(in.dir, "argv"), nil); err != nil {
			r.removeSecrets(out.secrets)
			return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
		return out, nil
	}
	if err := countTurn(in.state, in.agentName, in.worktree); err != nil {
		r.removeSecrets(out.secrets)
		return nil, err
	}
	return out, nil
}

// applyHome resets HOME and writes the managed policy.
func (r *Runner) applyHome(ctx context.Context, out *prepared) error {
	p := out.Plan
	var err error
	if out.reset, err = r.host().Reset(ctx, home.ResetInput{Task: p.home}); err != nil {
		return fmt.Errorf("%w: HOME reset failed, the turn does not start: %w%s", ErrHostNotReady, err, r.noSpaceHint(err))
	}
	if err := p.policy.Write(); err != nil {
		return fmt.Errorf("%w: managed policy: %w", ErrHostNotReady, err)
	}
	// The cage's root is the task's first host id.
	if err := p.policy.OwnRoot(int(p.ids.UID), int(p.ids.GID)); err != nil {
		return fmt.Errorf("%w: managed policy: %w", ErrHostNotReady, err)
	}
	return nil
}

// applyFiles lays out the rest of the host side of the cage's mounts: the
// git metadata, the gateway placeholder of a cage prepared ahead (in the
// task's directory, dir), the sign-in file and the seccomp profile.
func (r *Runner) applyFiles(ctx context.Context, dir string, out *prepared, s steps) error {
	p, cfg := out.Plan, r.Cfg
	if err := p.git.Write(); err != nil {
		return fmt.Errorf("%w: git metadata: %w", ErrInput, err)
	}
	if err := p.gitConfig.Write(); err != nil {
		return fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if p.gateway != nil && s.record {
		if err := os.WriteFile(filepath.Join(dir, placeholderFile), []byte(p.gateway.Placeholder), 0o600); err != nil {
			return fmt.Errorf("%w: gateway placeholder: %w", ErrHostNotReady, err)
		}
	}
	if p.oauth != nil {
		// The cage's sign-in file holds the placeholder as its access
		// token, no refresh token, and an expiry the agent never reaches.
		if p.signIn == "" {
			return fmt.Errorf("%w: a subscription sign-in needs a HOME profile that has a sign-in file", ErrInput)
		}
		creds, err := p.oauth.CageCredentials(ctx, p.gateway.Placeholder)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInput, err)
		}
		if err := r.host().PlaceFile(p.root, p.signIn, creds, 0o600, p.home.UID, p.home.GID); err != nil {
			return fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
	}
	if p.seccomp {
		if _, err := seccomp.InstallFor(cfg.State.Dir, gvisor(cfg.Cage.Runtime)); err != nil {
			return fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
	}
	if p.resolvConf != "" {
		if err := cagenet.InstallResolvConf(p.resolvConf); err != nil {
			return fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
	}
	return nil
}
