package itest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Tmux is a tmux server of the test's own: its own -L socket name and no
// configuration file, so that the test can hang up its terminal (kill-server)
// without touching any other tmux on the machine.
type Tmux struct {
	t    testing.TB
	name string
	// pids are the programs Start ran: the cleanup waits for them to end
	// after it hangs their terminals up.
	pids []int
}

// NewTmux returns a tmux server for t (started by Start); it is killed at
// the end of the test. tmux missing fails the test under
// SHROOMS_REQUIRE_INTEGRATION=1 (`make setup` installs it), else skips it.
func NewTmux(t testing.TB) *Tmux {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		if Required() {
			t.Fatalf("integration prerequisite missing (SHROOMS_REQUIRE_INTEGRATION=1): tmux not installed (make setup)")
		}
		t.Skip("tmux not installed")
	}
	x := &Tmux{t: t, name: UniqueName("shrooms-test-")}
	t.Cleanup(func() {
		_ = x.cmd("kill-server").Run()
		for _, pid := range x.pids {
			WaitGone(t, pid, 2*time.Minute)
		}
		if dir := os.Getenv("TMUX_TMPDIR"); dir == "" {
			os.Remove(filepath.Join("/tmp", fmt.Sprintf("tmux-%d", os.Geteuid()), x.name))
		}
	})
	return x
}

func (x *Tmux) cmd(args ...string) *exec.Cmd {
	return exec.Command("tmux", append([]string{"-L", x.name, "-f", "/dev/null"}, args...)...)
}

// Start runs argv (executed directly, no shell) in a new detached session
// of cols x rows, with env added to the environment tmux gives it. The pane
// stays after the program exits, so its last screen can still be read.
func (x *Tmux) Start(cols, rows int, env []string, argv ...string) {
	x.t.Helper()
	args := []string{"new-session", "-d", "-x", strconv.Itoa(cols), "-y", strconv.Itoa(rows)}
	for _, kv := range env {
		args = append(args, "-e", kv)
	}
	args = append(args, "--")
	args = append(args, argv...)
	if out, err := x.cmd(args...).CombinedOutput(); err != nil {
		x.t.Fatalf("tmux new-session: %v: %s", err, out)
	}
	if out, err := x.cmd("set-option", "-g", "remain-on-exit", "on").CombinedOutput(); err != nil {
		x.t.Fatalf("tmux set-option: %v: %s", err, out)
	}
	x.pids = append(x.pids, x.PanePID())
}

// PanePID is the pid of the program Start ran.
func (x *Tmux) PanePID() int {
	x.t.Helper()
	out, err := x.cmd("display-message", "-p", "#{pane_pid}").Output()
	if err != nil {
		x.t.Fatalf("tmux display-message: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		x.t.Fatalf("tmux pane pid %q: %v", out, err)
	}
	return pid
}

// Screen is what the pane shows now (wrapped lines joined).
func (x *Tmux) Screen() string {
	out, err := x.cmd("capture-pane", "-p", "-J").Output()
	if err != nil {
		return fmt.Sprintf("(capture-pane: %v)", err)
	}
	return string(out)
}

// WaitFor waits until the pane shows text and returns the screen.
func (x *Tmux) WaitFor(text string, timeout time.Duration) string {
	x.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s := x.Screen()
		if strings.Contains(s, text) {
			return s
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("%q never showed in tmux; the screen:\n%s", text, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Type sends keys as tmux send-keys names them ("Enter", "C-c", or literal
// text with literal set).
func (x *Tmux) Type(literal bool, keys ...string) {
	x.t.Helper()
	args := []string{"send-keys"}
	if literal {
		args = append(args, "-l")
	}
	if out, err := x.cmd(append(args, keys...)...).CombinedOutput(); err != nil {
		x.t.Fatalf("tmux send-keys: %v: %s", err, out)
	}
}

// KillServer hangs up every terminal of this tmux server (only this one).
func (x *Tmux) KillServer() {
	x.t.Helper()
	if out, err := x.cmd("kill-server").CombinedOutput(); err != nil {
		x.t.Fatalf("tmux kill-server: %v: %s", err, out)
	}
}

// WaitGone waits until process pid no longer runs (it is not the test's
// child: the tmux server started it).
func WaitGone(t testing.TB, pid int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		// A zombie waiting for its reaper has ended too.
		if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs after %v", pid, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
