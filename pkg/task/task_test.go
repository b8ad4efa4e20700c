package task

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testcfg"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/gitseal"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/turn"
	"github.com/shrooms-cage/shrooms/pkg/worktree/guard"
)

func TestFlockHolder(t *testing.T) {
	locks := []byte(`1: POSIX  ADVISORY  WRITE 111 fd:01:131 0 EOF
2: FLOCK  ADVISORY  WRITE 4242 fd:01:131 0 EOF
2: -> FLOCK  ADVISORY  WRITE 5555 fd:01:131 0 EOF
3: FLOCK  ADVISORY  WRITE 777 08:10:131 0 EOF
`)
	assert.Equal(t, flockHolder(locks, 0xfd, 1, 131), 4242, "the FLOCK holder, not a POSIX lock or a waiter")
	assert.Equal(t, flockHolder(locks, 8, 16, 131), 777, "device numbers are hex")
	assert.Equal(t, flockHolder(locks, 0xfd, 1, 132), 0)
}

func TestAcceptAgentConfig(t *testing.T) {
	changes := []guard.Change{
		{Path: ".claude/settings.json", Change: "added", Why: "hooks"},
		{Path: "CLAUDE.md", Change: "deleted"},
	}
	err := acceptAgentConfig(changes, nil)
	assert.Assert(t, errors.Is(err, ErrAgentConfig), "%v", err)
	assert.Assert(t, errors.Is(err, fault.Input), "%v", err)
	assert.ErrorContains(t, err, ".claude/settings.json (added: hooks)")
	assert.NilError(t, acceptAgentConfig(changes, []string{".claude/settings.json"}))
	assert.NilError(t, acceptAgentConfig(changes, []string{".claude/settings.json", "CLAUDE.md"}), "a deleted path may be named")
	err = acceptAgentConfig(changes, []string{".claude/settings.json", "other"})
	assert.Assert(t, errors.Is(err, fault.Input) && !errors.Is(err, ErrAgentConfig), "%v", err)
	assert.ErrorContains(t, err, `"other" names no changed agent config`)
}

// TestCheckTask needs only a state directory: it runs unprivileged. (An
// invalid id never reaches it: the CLI parses --task, see taskArg.)
func TestCheckTask(t *testing.T) {
	cfg := &config.Config{State: config.State{Dir: t.TempDir()}}
	err := CheckTask(cfg, taskid.Must("nosuch"))
	assert.Assert(t, errors.Is(err, fault.Input) && errors.Is(err, ErrUnknownTask), "%v", err)
	assert.NilError(t, os.MkdirAll(filepath.Join(cfg.State.Dir, "tasks", "known"), 0o700))
	assert.NilError(t, CheckTask(cfg, taskid.Must("known")))
}

// TestCommandPhaseKinds: a task command kinds once what fails in it without
// a kind (the state directory: the host's to fix) and keeps the kind a
// deeper step decided (bad input). Unprivileged, no podman.
func TestCommandPhaseKinds(t *testing.T) {
	cfg := &config.Config{State: config.State{Dir: t.TempDir()}}
	r := state(cfg)
	id := taskid.Must("known")
	assert.NilError(t, os.MkdirAll(r.taskDir(id), 0o700))
	ctx := context.Background()

	_, err := r.Commit(ctx, id, "m", gitseal.Author{}, nil)
	assert.Equal(t, fault.Of(err), fault.Input, "%v", err)
	assert.ErrorContains(t, err, `bad input: task "known" has no worktree`)
	assert.NilError(t, r.Store.Remember(id, taskstate.FactWorktree, t.TempDir()))
	_, err = r.Commit(ctx, id, "m", gitseal.Author{}, nil)
	assert.Equal(t, fault.Of(err), fault.Input, "%v", err)
	assert.ErrorContains(t, err, "has no trusted record")
	// A trust record shrooms cannot read: the host's, said once.
	assert.NilError(t, os.MkdirAll(r.trustStore(id).Dir, 0o700))
	assert.NilError(t, os.WriteFile(filepath.Join(r.trustStore(id).Dir, "manifest.json"), []byte("{"), 0o600))
	_, err = r.Commit(ctx, id, "m", gitseal.Author{}, nil)
	assert.Equal(t, fault.Of(err), fault.HostNotReady, "%v", err)
	assert.Assert(t, strings.HasPrefix(err.Error(), "host not ready: worktree trust: "), "%v", err)
	assert.Assert(t, !strings.Contains(strings.TrimPrefix(err.Error(), "host not ready"), "host not ready"), "kinded twice: %v", err)

	_, err = r.Reset(ctx, id, "", true)
	assert.Equal(t, fault.Of(err), fault.Input, "%v", err)
	assert.ErrorContains(t, err, "has run no agent yet")

	st, err := r.Status(id)
	assert.NilError(t, err)
	assert.Equal(t, st.Turns, 0)
	assert.NilError(t, os.WriteFile(filepath.Join(r.taskDir(id), "turn"), []byte("x"), 0o600))
	_, err = r.Status(id)
	assert.Equal(t, fault.Of(err), fault.HostNotReady, "%v", err)
	assert.Assert(t, strings.HasPrefix(err.Error(), "host not ready: turn counter "), "%v", err)
	_, err = r.Status(taskid.Must("nosuch"))
	assert.Equal(t, fault.Of(err), fault.Input, "an unknown task stays bad input: %v", err)
}

// world is the task commands on the test podman service with a private
// state dir (itest.Env, whose cleanup removes what the tasks left).
func world(t *testing.T) (e *itest.Env, cfg *config.Config, client *podman.Client, cmds *Commands, turns *turn.Runner) {
	t.Helper()
	e, cfg, client = testcfg.Env(t, "tk", testcfg.Config{Cage: map[string]any{"pids": 128}})
	return e, cfg, client, New(cfg, client), turn.NewRunner(cfg, client, nil)
}

func cagesOf(t *testing.T, client *podman.Client, task string) []podman.Cage {
	cages, err := client.ListByLabel(context.Background(), sealed.LabelTask, task)
	assert.NilError(t, err)
	return cages
}

// TestLeftoverCageIsRemovedByGC: a running cage as a crashed shrooms would
// leave it is removed by gc.
func TestLeftoverCageIsRemovedByGC(t *testing.T) {
	e, _, client, cmds, turns := world(t)
	ctx := context.Background()
	task := e.Task("left")
	// A first turn leaves what a turn writes (seccomp profile, HOME policy);
	// the leftover is the cage of the next one.
	res, err := turns.Run(ctx, turn.Request{Task: taskid.Must(task), Agent: "shell", Args: []string{"-c", "true"}})
	assert.NilError(t, err)
	assert.Equal(t, res.ExitCode, 0)
	spec, err := turns.Spec(ctx, turn.Request{Task: taskid.Must(task), Agent: "shell", Args: []string{"-c", "sleep 600"}})
	assert.NilError(t, err)
	// A crashed shrooms leaves its HOME mounted (a turn releases it at its end).
	_, err = cmds.Homes.Mounted(ctx, taskid.Must(task))
	assert.NilError(t, err)
	id, err := client.Create(ctx, spec)
	assert.NilError(t, err)
	_, err = client.Start(ctx, id, podman.Streams{})
	assert.NilError(t, err)
	assert.Equal(t, len(cagesOf(t, client, task)), 1, "the positive control: the leftover cage exists")

	rep, err := cmds.GC(ctx)
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(rep.Removed, spec.Name))
	assert.Equal(t, len(cagesOf(t, client, task)), 0)
	assert.Equal(t, len(rep.Released), 1, "gc released the HOME mount: %v", rep.Released)
}

// TestBootstrapOnce: bootstrap seeds a new HOME once, leaves it as it is
// the second time, and releases its mount both times (no cage holds it).
func TestBootstrapOnce(t *testing.T) {
	e, _, _, cmds, _ := world(t)
	ctx := context.Background()
	task := taskid.Must(e.Task("boot"))
	out, err := cmds.Bootstrap(ctx, task, nil)
	assert.NilError(t, err)
	assert.Equal(t, out.Result, home.Bootstrapped)
	atts, err := cmds.Homes.AttachmentsOf(task)
	assert.NilError(t, err)
	assert.Equal(t, len(atts), 0, "bootstrap released the HOME: %v", atts)
	out, err = cmds.Bootstrap(ctx, task, nil)
	assert.NilError(t, err)
	assert.Equal(t, out.Result, home.AlreadyBootstrapped)
	// The positive control: a mounted HOME shows its loop device.
	_, err = cmds.Homes.Mounted(ctx, task)
	assert.NilError(t, err)
	atts, err = cmds.Homes.AttachmentsOf(task)
	assert.NilError(t, err)
	assert.Equal(t, len(atts), 1, "%v", atts)
}

// TestForgetRemovesTheTask: forget removes the task's HOME volume and
// state; the task is then unknown.
func TestForgetRemovesTheTask(t *testing.T) {
	e, cfg, client, cmds, _ := world(t)
	ctx := context.Background()
	task := e.Task("forget")
	_, err := cmds.Bootstrap(ctx, taskid.Must(task), nil)
	assert.NilError(t, err)
	ok, err := client.VolumeExists(ctx, cmds.Homes.Name(taskid.Must(task)))
	assert.NilError(t, err)
	assert.Assert(t, ok, "the positive control: the HOME volume exists")
	assert.NilError(t, CheckTask(cfg, taskid.Must(task)))

	assert.NilError(t, cmds.Forget(ctx, taskid.Must(task)))
	ok, err = client.VolumeExists(ctx, cmds.Homes.Name(taskid.Must(task)))
	assert.NilError(t, err)
	assert.Assert(t, !ok, "the HOME volume is gone")
	_, err = os.Stat(cmds.taskDir(taskid.Must(task)))
	assert.Assert(t, os.IsNotExist(err), "the task state is gone: %v", err)
	err = cmds.Forget(ctx, taskid.Must(task))
	assert.Assert(t, errors.Is(err, ErrUnknownTask), "%v", err)
}
