package turn

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// The detached child removes the turn's cage from what the listing of the
// task's cages before the next cage's preparation saw, without inspecting
// it again: only a cage of this state directory and of this task goes
// (negative controls: another task's cage, a cage of another state
// directory, a container shrooms did not make, all in what it is given;
// positive control: the task's own cage, then its id again once gone).
func TestRemoveTaskCageOnlyOurs(t *testing.T) {
	itest.Require(t, itest.Podman)
	ctx := context.Background()
	client, err := podman.Connect(ctx, itest.Socket())
	assert.NilError(t, err)
	state := t.TempDir()
	task, other := taskid.Must(itest.UniqueName("rmt")), taskid.Must(itest.UniqueName("rmo"))
	ours := func(tk taskid.ID, dir string) []string {
		return []string{"--label", sealed.LabelManaged + "=1", "--label", sealed.LabelState + "=" + sealed.StateLabel(dir),
			"--label", sealed.LabelTask + "=" + tk.String()}
	}
	create := func(labels ...string) string {
		args := append(append([]string{"--url", itest.Socket(), "create"}, labels...), itest.TestImage, "true")
		out, err := exec.Command("podman", args...).CombinedOutput()
		assert.NilError(t, err, string(out))
		id := strings.TrimSpace(string(out))
		t.Cleanup(func() { _ = exec.Command("podman", "--url", itest.Socket(), "rm", "-f", id).Run() })
		return id
	}
	exists := func(id string) bool {
		c, err := client.CageNamed(ctx, id)
		assert.NilError(t, err)
		return c != nil
	}
	mine := create(ours(task, state)...)
	otherTask := create(ours(other, state)...)
	otherState := create(ours(task, t.TempDir())...)
	foreign := create("--label", sealed.LabelTask+"="+task.String())
	r := &Runner{Cfg: &config.Config{State: config.State{Dir: state}}, Podman: client}
	var seen []podman.Cage
	for _, tk := range []taskid.ID{task, other} {
		cs, err := client.ListByLabel(ctx, sealed.LabelTask, tk.String())
		assert.NilError(t, err)
		seen = append(seen, cs...)
	}
	assert.Equal(t, len(seen), 4, "the listings show the four containers")

	for _, id := range []string{otherTask, otherState, foreign} {
		assert.NilError(t, r.removeTaskCage(ctx, task, id, seen))
		assert.Assert(t, exists(id), "removed a cage that is not the task's own: %s", id)
	}
	assert.NilError(t, r.removeTaskCage(ctx, task, mine, seen))
	assert.Assert(t, !exists(mine), "the task's own cage is still there")
	assert.NilError(t, r.removeTaskCage(ctx, task, mine, seen), "a removed cage is no error")
}
