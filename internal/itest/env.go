package itest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// The cage labels of pkg/sealed (which this package cannot import: the
// tests of pkg/profile, below it, import this one). internal/testcfg's
// test checks they agree.
const (
	LabelManaged = "io.shrooms.managed"
	LabelTask    = "io.shrooms.task"
)

// Env is one integration test's world: a private directory (the config,
// the state dir, the outbox), a prefix unique to the run that names every
// task, HOME volume, network and table the test makes, a podman service,
// the shrooms CLI, and the cleanup of all of it when the test ends. What a
// package's tests add (a config, a turn.Runner, a testbed) they build from
// its fields: this package imports nothing of shrooms above pkg/taskstate,
// since the tests of most packages import it.
type Env struct {
	T testing.TB
	// Dir is the test's directory: config.toml, state/, outbox/.
	Dir string
	// State is the state directory (Dir/state unless WithStateDir).
	State string
	// Outbox is the outbox root, Dir/outbox.
	Outbox string
	// Prefix is unique to the run: tasks are Prefix-name, HOME volumes
	// shrooms-home-Prefix-task.
	Prefix string
	// Socket is the podman API URL.
	Socket string
	// Config is the path of the config file the CLI is given (see
	// WriteConfig).
	Config string
	// Release removes what a task left besides its cages (its HOME, its
	// outbox), with the package's own building blocks (home.Store, the
	// CLI's forget); nil leaves them.
	Release func(ctx context.Context, task taskid.ID) error

	o       options
	finally []func()
}

// Option varies an Env.
type Option func(*options)

type options struct {
	socket   string
	stateDir string
	bin      string
	binEnv   []string
	main     func(args []string, stdin io.Reader, stdout, stderr io.Writer) int
	netns    string
	prepared bool
	noPodman bool
	forget   bool
}

// WithSocket runs the test on another podman service than Socket() (a
// testbed's, a private one).
func WithSocket(url string) Option { return func(o *options) { o.socket = url } }

// WithStateDir puts the state directory elsewhere (a small filesystem).
func WithStateDir(dir string) Option { return func(o *options) { o.stateDir = dir } }

// WithBinary runs the CLI as the executable path, with env added to the
// test's environment (default: ShroomsBinary).
func WithBinary(path string, env ...string) Option {
	return func(o *options) { o.bin, o.binEnv = path, env }
}

// WithMain runs the CLI in-process, through main (cmd/shrooms' tests).
func WithMain(main func(args []string, stdin io.Reader, stdout, stderr io.Writer) int) Option {
	return func(o *options) { o.main = main }
}

// WithNetNS runs the CLI inside the network namespace at path (a
// testbed's host).
func WithNetNS(path string) Option { return func(o *options) { o.netns = path } }

// WithPrepared says the test leaves prepared next cages by design: the
// cleanup removes them without calling them left behind.
func WithPrepared() Option { return func(o *options) { o.prepared = true } }

// WithoutPodman is a world whose podman service does not answer (the CLI's
// refusals before it reaches podman): the cleanup lists no cages.
func WithoutPodman() Option { return func(o *options) { o.noPodman = true } }

// WithForget says Release removes a task's cages too (the CLI's forget):
// the cleanup counts the cages left after it, as forget's failure.
func WithForget() Option { return func(o *options) { o.forget = true } }

// New makes the world of one test named with prefix (two letters) and
// removes what its tasks left when the test ends.
func New(t testing.TB, prefix string, opts ...Option) *Env {
	t.Helper()
	e := &Env{T: t, Dir: t.TempDir(), Prefix: UniqueName(prefix)}
	for _, opt := range opts {
		opt(&e.o)
	}
	e.Socket = e.o.socket
	if e.Socket == "" {
		e.Socket = Socket()
	}
	e.State = e.o.stateDir
	if e.State == "" {
		e.State = filepath.Join(e.Dir, "state")
	}
	e.Outbox = filepath.Join(e.Dir, "outbox")
	t.Cleanup(e.cleanup)
	return e
}

// Task returns the id of the test's task name.
func (e *Env) Task(name string) string { return e.Prefix + "-" + name }

// Volume returns the name of a task's HOME volume.
func (e *Env) Volume(task string) string { return "shrooms-home-" + e.Prefix + "-" + task }

// WriteConfig writes the config the CLI is given, Dir/config.toml.
func (e *Env) WriteConfig(text string) string {
	e.T.Helper()
	e.Config = filepath.Join(e.Dir, "config.toml")
	if err := os.WriteFile(e.Config, []byte(text), 0o600); err != nil {
		e.T.Fatalf("write config: %v", err)
	}
	return e.Config
}

// Finally adds fn to the cleanup, after the tasks' cages, HOMEs and
// outboxes are gone (a network, a table the tasks used), in the order
// added.
func (e *Env) Finally(fn func()) { e.finally = append(e.finally, fn) }

// Command returns the CLI, with the env's config, as a process.
func (e *Env) Command(args ...string) *exec.Cmd {
	bin := e.o.bin
	if bin == "" {
		bin = ShroomsBinary(e.T)
	}
	argv := append([]string{bin, "--config", e.Config}, args...)
	if e.o.netns != "" {
		argv = append([]string{"nsenter", "--net=" + e.o.netns, "--"}, argv...)
	}
	c := exec.Command(argv[0], argv[1:]...)
	c.Env = append(append(os.Environ(), "SHROOMS_CONFIG="), e.o.binEnv...)
	return c
}

// CLI runs the CLI (in-process with WithMain) and returns its exit code
// and output. A `run` returns before its detached teardown is done.
func (e *Env) CLI(args ...string) (code int, stdout, stderr string) {
	e.T.Helper()
	var out, errb bytes.Buffer
	if e.o.main != nil {
		code = e.o.main(append([]string{"shrooms", "--config", e.Config}, args...), strings.NewReader(""), &out, &errb)
		return code, out.String(), errb.String()
	}
	c := e.Command(args...)
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		e.T.Fatalf("run shrooms: %v", err)
	}
	return c.ProcessState.ExitCode(), out.String(), errb.String()
}

// Shrooms is CLI, and after a `run` it waits for the turn's teardown, as
// the task's next turn would.
func (e *Env) Shrooms(args ...string) (code int, stdout, stderr string) {
	e.T.Helper()
	code, stdout, stderr = e.CLI(args...)
	if slices.Contains(args, "run") {
		if i := slices.Index(args, "--task"); i >= 0 && i+1 < len(args) {
			e.WaitIdle(args[i+1])
		}
	}
	return code, stdout, stderr
}

// Podman runs the podman CLI against the env's service.
func (e *Env) Podman(args ...string) (string, error) {
	out, err := exec.Command("podman", append([]string{"--url", e.Socket}, args...)...).CombinedOutput()
	return string(out), err
}

// WaitIdle waits until no detached teardown holds the task (the removal
// of a turn's cage and the release of its HOME go on after `run`
// returned), and until the teardown's job is over: with the next cage
// prepared, it drops the task lock before it removes the exited cage. A
// teardown holds the task's teardown.log (a shared flock) until its job is
// over: a child until it exits, a lingering worker (cage.teardown_linger)
// until the job ends, the worker staying. A turn holding the task is not
// waited for. This is the one wait for a teardown of the integration
// tests.
func (e *Env) WaitIdle(task string) {
	id, err := taskid.Parse(task)
	if err != nil {
		return
	}
	layout := taskstate.Layout{Dir: e.State}
	f, err := os.OpenFile(layout.TaskFile(id, "lock"), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer f.Close()
	// The lock file's text names the last teardown's pid; it stays after
	// the teardown dropped the lock (taskstate.Store.TeardownHolder, which
	// asks the lock, would miss a teardown past that point).
	mark := make([]byte, 32)
	n, _ := f.ReadAt(mark, 0)
	rest, ok := strings.CutPrefix(string(mark[:n]), "teardown ")
	if !ok {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(rest))
	if err != nil || pid <= 0 {
		return
	}
	// A plain flock, not the task lock: it marks no holder, so a turn
	// starting meanwhile waits as it would for the teardown.
	deadline := time.Now().Add(taskstate.TeardownWait)
	for unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		if time.Now().After(deadline) {
			e.T.Errorf("the teardown of %s (pid %d) still holds it after %s", task, pid, taskstate.TeardownWait)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	log, err := os.OpenFile(layout.TaskFile(id, "teardown.log"), os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer log.Close()
	for unix.Flock(int(log.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		if time.Now().After(deadline) {
			e.T.Errorf("the teardown of %s (pid %d) still runs after %s", task, pid, taskstate.TeardownWait)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Dropped at once: a later turn's teardown takes it shared.
	_ = unix.Flock(int(log.Fd()), unix.LOCK_UN)
}

// Tasks are the tasks the state directory knows.
func (e *Env) Tasks() []taskid.ID {
	entries, _ := os.ReadDir(taskstate.Layout{Dir: e.State}.Tasks())
	var ids []taskid.ID
	for _, d := range entries {
		if id, err := taskid.Parse(d.Name()); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// Cages lists the ids of the managed cages of the given tasks on the env's
// service. Each task is asked for by its label: podman 4.3 fails a whole
// listing while any container it lists is between its netns teardown and
// its removal ("unknown FS magic", podman#16140), and on a shared host
// other tests' cages always are; a task of this test is not, once idle
// (and the listing is asked again if it is: podmanRetried).
func (e *Env) Cages(tasks ...string) ([]string, error) {
	var ids []string
	for _, task := range tasks {
		out, err := e.podmanRetried("ps", "-a", "--filter", "label="+LabelTask+"="+task, "--format", `{{.ID}} {{index .Labels "`+LabelManaged+`"}}`)
		if err != nil {
			return nil, fmt.Errorf("podman ps: %w: %s", err, out)
		}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if id, managed, _ := strings.Cut(line, " "); id != "" && managed == "1" {
				ids = append(ids, id)
			}
		}
	}
	return ids, nil
}

// RemoveCage force-removes a container as `podman rm -f -t 0` does,
// riding out podman 4.3's transient refusals (podmanRetried): a cage's shm
// mount can stay busy for a moment after it died while a copy of it lives
// in another mount namespace (a conmon's), and pkg/podman's Remove retries
// the same way.
func (e *Env) RemoveCage(id string) (string, error) {
	return e.podmanRetried("rm", "-f", "-t", "0", id)
}

// podmanRetried is Podman, asked again for up to 30 s while it fails on
// podman#16140 ("unknown FS magic") or on a mount still busy ("device or
// resource busy"), as pkg/podman does.
func (e *Env) podmanRetried(args ...string) (out string, err error) {
	for wait, start := 50*time.Millisecond, time.Now(); ; wait = min(2*wait, 2*time.Second) {
		out, err = e.Podman(args...)
		transient := strings.Contains(out, "unknown FS magic") || strings.Contains(out, "device or resource busy")
		if err == nil || !transient || time.Since(start) > 30*time.Second {
			return out, err
		}
		time.Sleep(wait)
	}
}

// cleanup waits for every task's teardown, removes the cages left (a
// test's failure unless WithPrepared), releases each task (Release; with
// WithForget before the cages are counted) and runs the Finally functions.
func (e *Env) cleanup() {
	tasks := e.Tasks()
	for _, id := range tasks {
		e.WaitIdle(id.String())
	}
	if e.o.forget {
		e.release(tasks)
	}
	// A test that made no task made no cage. Carry on when listing
	// fails: the HOMEs and outboxes must go regardless.
	if len(tasks) > 0 && !e.o.noPodman {
		names := make([]string, len(tasks))
		for i, id := range tasks {
			names[i] = id.String()
		}
		cages, err := e.Cages(names...)
		if err != nil {
			e.T.Errorf("list cages: %v", err)
		}
		for _, c := range cages {
			if !e.o.prepared {
				e.T.Errorf("cage %s of this test was left behind", c)
			}
			if out, err := e.podmanRetried("rm", "-f", "-t", "0", c); err != nil {
				e.T.Errorf("remove cage %s: %v: %s", c, err, out)
			}
		}
	}
	if !e.o.forget {
		e.release(tasks)
	}
	for _, fn := range e.finally {
		fn()
	}
}

func (e *Env) release(tasks []taskid.ID) {
	if e.Release == nil {
		return
	}
	for _, id := range tasks {
		if err := e.Release(context.Background(), id); err != nil {
			e.T.Errorf("release %s: %v", id, err)
		}
	}
}
