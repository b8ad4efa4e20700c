package taskstate

import (
	"bytes"
	"os"
	"path/filepath"

	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// Layout names every path under the state directory (config state.dir),
// once: no other package joins a path onto the state directory.
type Layout struct{ Dir string }

// Tasks is the directory of the tasks' state directories.
func (l Layout) Tasks() string { return filepath.Join(l.Dir, "tasks") }

// Task is one task's state directory.
func (l Layout) Task(task taskid.ID) string { return filepath.Join(l.Tasks(), task.String()) }

// TaskFile is a file of one task's state directory.
func (l Layout) TaskFile(task taskid.ID, name string) string {
	return filepath.Join(l.Task(task), name)
}

// History is the directory of a task's conversation pins (pkg/history).
func (l Layout) History(task taskid.ID) string { return l.TaskFile(task, "history") }

// Homes is the directory of the task HOME images.
func (l Layout) Homes() string { return filepath.Join(l.Dir, "homes") }

// HomeImage is the HOME image of a volume: homes/<volume>.img.
func (l Layout) HomeImage(volume string) string { return filepath.Join(l.Homes(), volume+".img") }

// Worktrees is the directory of the worktree claims.
func (l Layout) Worktrees() string { return filepath.Join(l.Dir, "worktrees") }

// WorktreeClaim is a worktree's claim file, by the worktree's key.
func (l Layout) WorktreeClaim(key string) string { return filepath.Join(l.Worktrees(), key+".json") }

// Delivery is one delivery of a task's outbox, moved aside at stamp.
func (l Layout) Delivery(task taskid.ID, stamp string) string {
	return filepath.Join(l.Dir, "deliveries", task.String(), stamp)
}

// GatewayCredentials is where a gateway keeps its refreshed sign-in.
func (l Layout) GatewayCredentials(gateway string) string {
	return filepath.Join(l.Dir, "gateway", gateway, "credentials.json")
}

// GatewayChatGPT is where an openai gateway keeps its refreshed ChatGPT
// sign-in (a Codex auth.json).
func (l Layout) GatewayChatGPT(gateway string) string {
	return filepath.Join(l.Dir, "gateway", gateway, "auth.json")
}

// SeccompProfile is an installed seccomp profile, by file name.
func (l Layout) SeccompProfile(name string) string { return filepath.Join(l.Dir, "seccomp", name) }

// CageResolvConf is the resolv.conf bound into cages under network.driver
// "shrooms" (cagenet.InstallResolvConf).
func (l Layout) CageResolvConf() string { return filepath.Join(l.Dir, "cagenet", "resolv.conf") }

// ExpireStamp's time is the last sweep for expired prepared cages by a
// teardown (task.ExpireDue).
func (l Layout) ExpireStamp() string { return filepath.Join(l.Dir, "expire.stamp") }

// GitsealConfig is the cages' system git configuration (/etc/gitconfig).
func (l Layout) GitsealConfig() string { return filepath.Join(l.Dir, "gitseal", "gitconfig") }

// GitsealDotgit is a worktree's sealed .git file, by the worktree's key.
func (l Layout) GitsealDotgit(key string) string {
	return filepath.Join(l.Dir, "gitseal", key, "dotgit")
}

// TeardownSocket is where a lingering teardown worker listens
// (pkg/teardownd); TeardownWorker is the file it holds locked while it
// does, with its pid. A worker whose socket is removed ends.
func (l Layout) TeardownSocket() string { return filepath.Join(l.Dir, teardownSocket) }

// TeardownWorker: see TeardownSocket.
func (l Layout) TeardownWorker() string { return filepath.Join(l.Dir, teardownWorker) }

const (
	teardownSocket = "teardownd.sock"
	teardownWorker = "teardownd.lock"
)

// InstallFile writes content to path (mode 0644, its directory made 0755)
// unless it is already there with that content: a file the podman service
// reads at a cage's create (a seccomp profile, the cage's resolv.conf).
// The new content is renamed into place, so a reader never sees half.
func InstallFile(path string, content []byte) error {
	if b, err := os.ReadFile(path); err == nil && bytes.Equal(b, content) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".install-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(content)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
