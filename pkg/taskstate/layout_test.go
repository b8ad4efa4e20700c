package taskstate

import (
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
