package teardownd

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// files opens Files temporary files, the second a directory as a task
// lock's is.
func files(t *testing.T) []*os.File {
	dir := t.TempDir()
	var out []*os.File
	for _, name := range []string{"lock", ".", "teardown.log"} {
		f, err := os.Open(filepath.Join(dir, name))
		if os.IsNotExist(err) {
			assert.NilError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o600))
			f, err = os.Open(filepath.Join(dir, name))
		}
		assert.NilError(t, err)
		t.Cleanup(func() { f.Close() })
		out = append(out, f)
	}
	return out
}

func sameFile(t *testing.T, a, b *os.File) bool {
	var sa, sb unix.Stat_t
	assert.NilError(t, unix.Fstat(int(a.Fd()), &sa))
	assert.NilError(t, unix.Fstat(int(b.Fd()), &sb))
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// TestHandOver: a job with its files reaches the worker with the same key
// (the files are the same open files), a wrong key is answered no and
// runs nothing, the worker ends after its linger with no job running and
// takes its socket with it; a second worker of the same directory is
// refused while the first is there.
func TestHandOver(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	assert.NilError(t, os.Mkdir(state, 0o700))
	socket, lock := filepath.Join(state, "teardownd.sock"), filepath.Join(state, "teardownd.lock")
	// A socket left by a dead worker is replaced.
	assert.NilError(t, os.WriteFile(socket, nil, 0o600))
	srv, err := Listen(socket, lock)
	assert.NilError(t, err)
	_, err = Listen(socket, lock)
	assert.Equal(t, err, ErrTaken)
	assert.Equal(t, Running(lock), os.Getpid())

	type got struct {
		job   Job
		files []*os.File
	}
	jobs := make(chan got, 2)
	served := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(served)
		srv.Serve(context.Background(), "k", 700*time.Millisecond, func(job Job, fs []*os.File) {
			jobs <- got{job, fs}
		})
	}()
	fs := files(t)
	job := Job{Task: "t1", Agent: "shell", Cage: "c", Secrets: []string{"s"}, PrepareNext: true, Timeout: time.Minute, Gate: "/g"}
	_, err = Hand(socket, "other", job, fs)
	assert.Assert(t, is.ErrorContains(err, "another binary"))
	pid, err := Hand(socket, "k", job, fs)
	assert.NilError(t, err)
	assert.Equal(t, pid, os.Getpid())
	g := <-jobs
	assert.DeepEqual(t, g.job, job)
	assert.Equal(t, len(g.files), Files)
	for i := range fs {
		assert.Assert(t, sameFile(t, g.files[i], fs[i]), "file %d", i)
		g.files[i].Close()
	}
	_, err = Hand(socket, "k", job, fs[:2])
	assert.Assert(t, err != nil)
	select {
	case <-jobs:
		t.Fatal("a wrong key or a short hand-over ran a job")
	default:
	}
	<-served
	assert.Assert(t, time.Since(start) >= 700*time.Millisecond)
	_, err = os.Lstat(socket)
	assert.Assert(t, os.IsNotExist(err), "socket left: %v", err)
	assert.Equal(t, Running(lock), 0)
	_, err = Hand(socket, "k", job, fs)
	assert.Assert(t, err != nil, "handed to a worker that ended")
}

// TestListenRefusesAnOpenDirectory: a state directory others can enter
// gets no worker.
func TestListenRefusesAnOpenDirectory(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	assert.NilError(t, os.Mkdir(state, 0o755))
	assert.NilError(t, os.Chmod(state, 0o755))
	_, err := Listen(filepath.Join(state, "teardownd.sock"), filepath.Join(state, "teardownd.lock"))
	assert.Assert(t, is.ErrorContains(err, "closed to others"))
}

// TestKey: the key changes with the config digest, the state directory
// and the environment, not with the test gates.
func TestKey(t *testing.T) {
	exe, err := os.Executable()
	assert.NilError(t, err)
	base, err := Key(exe, exe, "/c.toml", "sha256:a", "/s")
	assert.NilError(t, err)
	self, err := Key(exe, "/proc/self/exe", "/c.toml", "sha256:a", "/s")
	assert.NilError(t, err)
	assert.Equal(t, self, base, "the running binary is the file at its path")
	for _, k := range [][3]string{{"/c.toml", "sha256:b", "/s"}, {"/d.toml", "sha256:a", "/s"}, {"/c.toml", "sha256:a", "/t"}} {
		other, err := Key(exe, exe, k[0], k[1], k[2])
		assert.NilError(t, err)
		assert.Assert(t, other != base, "%v", k)
	}
	t.Setenv(GateEnv, "/gate")
	gated, err := Key(exe, exe, "/c.toml", "sha256:a", "/s")
	assert.NilError(t, err)
	assert.Equal(t, gated, base)
	t.Setenv("SHROOMS_SOMETHING", "x")
	env, err := Key(exe, exe, "/c.toml", "sha256:a", "/s")
	assert.NilError(t, err)
	assert.Assert(t, env != base)
}
