package task

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testcfg"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/turn"
	"github.com/shrooms-cage/shrooms/pkg/worktreeguard"
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
	changes := []worktreeguard.Change{
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

// world is the task commands on the test podman service with a private
// state dir (itest.Env, whose cleanup removes what the tasks left).
func world(t *testing.T) (e *itest.Env, cfg *config.Config, client *podman.Client, cmds *Commands, turns *turn.Runner) {
	t.Helper()
	e, cfg, client = testcfg.Env(t, "tk", testcfg.Config{Cage: map[string]any{"pids": 128}})
	turns = turn.NewRunner(cfg, client, nil)
	return e, cfg, client, New(cfg, client, turns), turns
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

// TestForgetRemovesTheTask: forget removes the task's HOME volume and
// state; the task is then unknown.
func TestForgetRemovesTheTask(t *testing.T) {
	e, cfg, client, cmds, turns := world(t)
	ctx := context.Background()
	task := e.Task("forget")
	_, err := turns.Bootstrap(ctx, taskid.Must(task), nil)
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
