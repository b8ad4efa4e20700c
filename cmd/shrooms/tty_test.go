package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/seccomp"
)

// agentImage has python3, which the terminal tests use to call TIOCSTI.
const agentImage = "localhost/shrooms-agent:latest"

// tiocsti tries to push "Z" into the cage's terminal input.
const tiocsti = `python3 -c "import fcntl, termios; fcntl.ioctl(0, termios.TIOCSTI, b'Z'); print('TIOCSTI injected')" 2>&1 | tail -n1`

// screen collects what a pty master shows.
type screen struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func (s *screen) read(f *os.File) {
	b := make([]byte, 4096)
	for {
		n, err := f.Read(b)
		s.mu.Lock()
		s.buf.Write(b[:n])
		s.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (s *screen) waitFor(t *testing.T, text string, done <-chan error) {
	t.Helper()
	deadline := time.After(90 * time.Second)
	for !strings.Contains(s.String(), text) {
		select {
		case err := <-done:
			t.Fatalf("shrooms ended (%v) before %q showed: %q", err, text, s.String())
		case <-deadline:
			t.Fatalf("%q never showed: %q", text, s.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// onTerminal starts cmd with slave as its controlling terminal.
func onTerminal(cmd *exec.Cmd, slave *os.File) {
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
}

// TestTTYTurn runs `shrooms run --tty` on a real pseudo-terminal, as a
// person at a terminal would: the cage has a terminal of the person's
// window size, what they type reaches the agent, TIOCSTI is denied in the
// cage (shrooms' seccomp profile) while a bare `podman run -t` of the same
// image lets it through (the positive control), and the person's terminal
// is back in its own mode afterwards.
func TestTTYTurn(t *testing.T) {
	e, client := integration(t, "")
	cfg, err := os.ReadFile(e.Config)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(e.Config, bytes.Replace(cfg, []byte(itest.TestImage), []byte(agentImage), 1), 0o600))

	master, slave := itest.OpenPTY(t, 40, 100)
	before, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
	assert.NilError(t, err)
	task := e.Task("tty")
	cmd := e.Command("run", "--tty", "--json", "--task", task, "--agent", "shell", "--", "-c",
		`tty; stty size; `+tiocsti+`; printf 'name? '; read name; echo "got:$name"; exit 3`)
	onTerminal(cmd, slave)
	var sc screen
	go sc.read(master)
	assert.NilError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	sc.waitFor(t, "name? ", done)
	_, err = master.Write([]byte("hello\r"))
	assert.NilError(t, err)
	select {
	case err = <-done:
	case <-time.After(90 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGTERM)
		t.Fatalf("the turn did not end: %q", sc.String())
	}
	var ee *exec.ExitError
	assert.Assert(t, err != nil && errors.As(err, &ee) && ee.ExitCode() == 3, "exit: %v; screen %q", err, sc.String())
	sc.waitFor(t, `"status":"exited"`, nil)
	out := strings.ReplaceAll(sc.String(), "\r", "")
	t.Logf("the terminal showed: %q", out)
	assert.Check(t, is.Contains(out, "/dev/pts/0\n"), "the cage has a terminal")
	assert.Check(t, is.Contains(out, "\n40 100\n"), "of the person's window size")
	assert.Check(t, is.Contains(out, "PermissionError: [Errno 1] Operation not permitted"), "TIOCSTI is denied in the cage")
	assert.Check(t, !strings.Contains(out, "TIOCSTI injected"))
	assert.Check(t, is.Contains(out, "got:hello\n"), "what the person typed reached the agent")
	assert.Check(t, is.Contains(out, `"exit_code":3`))
	after, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(*after, *before), "the terminal's mode is restored after the turn")
	e.WaitIdle(task) // the detached teardown removes the cage
	assert.Equal(t, cagesOf(e, client, task), 0)

	// The positive control: without shrooms' profile, the same call in the
	// same image with a terminal injects.
	bare := exec.Command("podman", "--url", itest.Socket(), "run", "--rm", "-t", "--name", itest.UniqueName("tty"),
		"--network", "none", "--user", "1000:1000", "--cap-drop", "ALL", agentImage, "sh", "-c", tiocsti)
	b, err := bare.CombinedOutput()
	assert.NilError(t, err, string(b))
	assert.Check(t, is.Contains(string(b), "TIOCSTI injected"), "bare podman run -t lets TIOCSTI through: %q", b)
}

// TestTTYRefusals: --tty needs a terminal on stdin (121), and with a
// seccomp profile that lets TIOCSTI through it needs the kernel to refuse
// it (dev.tty.legacy_tiocsti = 0); otherwise it refuses (122) with the fix,
// before any cage exists.
func TestTTYRefusals(t *testing.T) {
	e, client := integration(t, "")
	code, _, stderr := e.Shrooms("run", "--tty", "--task", e.Task("notty"), "--agent", "shell", "--", "-c", "true")
	assert.Equal(t, code, ExitUsage, stderr)
	assert.Check(t, is.Contains(stderr, "--tty needs a terminal"))

	cfg, err := os.ReadFile(e.Config)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(e.Config, bytes.Replace(cfg, []byte(`memory = "256m"`), []byte("memory = \"256m\"\nseccomp = \"podman\""), 1), 0o600))
	knob, kerr := os.ReadFile(seccomp.LegacyTIOCSTIKnob)
	if kerr == nil && strings.TrimSpace(string(knob)) == "0" {
		// This kernel refuses TIOCSTI itself: nothing for --tty to refuse.
		return
	}
	master, slave := itest.OpenPTY(t, 24, 80)
	task := e.Task("open")
	cmd := e.Command("run", "--tty", "--task", task, "--agent", "shell", "--", "-c", "echo ran")
	onTerminal(cmd, slave)
	var sc screen
	go sc.read(master)
	err = cmd.Run()
	var ee *exec.ExitError
	assert.Assert(t, errors.As(err, &ee), "%v", err)
	assert.Equal(t, ee.ExitCode(), ExitHostNotReady)
	fix := `set cage.seccomp = "shrooms"`
	if kerr == nil {
		fix = "sysctl -w dev.tty.legacy_tiocsti=0"
	}
	waitScreen(t, &sc, fix)
	assert.Check(t, !strings.Contains(sc.String(), "ran"))
	assert.Equal(t, cagesOf(e, client, task), 0)
}

func waitScreen(t *testing.T, sc *screen, text string) {
	t.Helper()
	for i := 0; i < 100 && !strings.Contains(sc.String(), text); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	assert.Check(t, is.Contains(sc.String(), text))
}
