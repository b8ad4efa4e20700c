package taskstate

import (
	"os"
	"testing"

	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"gotest.tools/v3/assert"
)

// TestLayout: every state-dir path, as the packages that used to join them
// by hand laid them out (a change here moves state an upgrade must find).
func TestLayout(t *testing.T) {
	l := Layout{Dir: "/var/lib/shrooms"}
	id, err := taskid.Parse("t1")
	assert.NilError(t, err)
	for got, want := range map[string]string{
		l.Tasks():                       "/var/lib/shrooms/tasks",
		l.Task(id):                      "/var/lib/shrooms/tasks/t1",
		l.TaskFile(id, "teardown.log"):  "/var/lib/shrooms/tasks/t1/teardown.log",
		l.Homes():                       "/var/lib/shrooms/homes",
		l.HomeImage("shrooms-home-t1"):  "/var/lib/shrooms/homes/shrooms-home-t1.img",
		l.Worktrees():                   "/var/lib/shrooms/worktrees",
		l.WorktreeClaim("ab"):           "/var/lib/shrooms/worktrees/ab.json",
		l.Delivery(id, "20261202T0000"): "/var/lib/shrooms/deliveries/t1/20261202T0000",
		l.GatewayCredentials("max"):     "/var/lib/shrooms/gateway/max/credentials.json",
		l.SeccompProfile("s.json"):      "/var/lib/shrooms/seccomp/s.json",
		l.GitsealDotgit("k"):            "/var/lib/shrooms/gitseal/k/dotgit",
	} {
		assert.Equal(t, got, want)
	}
	s := Store{Dir: l.Dir}
	p, err := s.taskPath(id)
	assert.NilError(t, err)
	assert.Equal(t, p, l.Task(id))
}

// TestDir: a task's Dir is the Store's directory of the task (what one
// writes the other reads, the history where Layout puts it), and the zero
// Dir, like the zero id, is refused before anything is read or written.
func TestDir(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	id := taskid.Must("t1")
	d, err := s.Task(id)
	assert.NilError(t, err)
	assert.Equal(t, d.Path(), Layout{Dir: s.Dir}.Task(id))
	assert.Equal(t, d.History(), Layout{Dir: s.Dir}.History(id))
	assert.Equal(t, d.Name(), "t1")
	assert.NilError(t, d.Remember(FactAgent, "claude"))
	got, err := s.Recall(id, FactAgent)
	assert.NilError(t, err)
	assert.Equal(t, got, "claude")
	n, err := s.NextTurn(id)
	assert.NilError(t, err)
	last, err := d.LastTurn()
	assert.NilError(t, err)
	assert.Equal(t, last, n)
	l, err := d.Lock()
	assert.NilError(t, err)
	_, err = s.LockTask(id)
	assert.ErrorContains(t, err, `task "t1" has a turn running`)
	assert.NilError(t, l.Release())

	_, err = s.Task(taskid.ID{})
	assert.ErrorContains(t, err, "no task id")
	var zero Dir
	_, err = zero.Lock()
	assert.ErrorContains(t, err, "no task id")
	_, err = zero.LastTurn()
	assert.ErrorContains(t, err, "no task id")
	_, err = zero.Recall(FactAgent)
	assert.ErrorContains(t, err, "no task id")
	assert.ErrorContains(t, zero.Remember(FactAgent, "x"), "no task id")
	assert.ErrorContains(t, zero.MarkRunning([]byte("{}")), "no task id")
	sub := t.TempDir() + "/subid"
	assert.NilError(t, os.WriteFile(sub, []byte("u:100000:1000000\n"), 0o600))
	files := IDFiles{SubUID: sub, SubGID: sub, User: "u"}
	ids, err := s.IDsOf(d, files, false)
	assert.NilError(t, err)
	want, err := s.TaskIDs(id, files, false)
	assert.NilError(t, err)
	assert.Equal(t, ids, want)
	_, err = s.IDsOf(zero, files, false)
	assert.ErrorContains(t, err, "no task id")
	entries, err := os.ReadDir(s.Dir)
	assert.NilError(t, err)
	assert.Equal(t, len(entries), 1, "only t1's tasks directory: %v", entries)
}
