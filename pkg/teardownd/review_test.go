package teardownd

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestSilentClientHoldsNothing: a client that connects and never says
// hello neither holds back another client's job nor keeps the worker past
// its linger by more than the hand-over's wait.
func TestSilentClientHoldsNothing(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	assert.NilError(t, os.Mkdir(state, 0o700))
	socket, lock := filepath.Join(state, "teardownd.sock"), filepath.Join(state, "teardownd.lock")
	srv, err := Listen(socket, lock)
	assert.NilError(t, err)
	jobs := make(chan Job, 1)
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(context.Background(), "k", 300*time.Millisecond, func(job Job, fs []*os.File) {
			for _, f := range fs {
				f.Close()
			}
			jobs <- job
		})
	}()
	var silent []*net.UnixConn
	for i := 0; i < 8; i++ {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
		assert.NilError(t, err)
		defer c.Close()
		silent = append(silent, c)
	}
	start := time.Now()
	_, err = Hand(socket, "k", Job{Task: "t"}, files(t))
	assert.NilError(t, err, "a job behind silent clients")
	assert.Equal(t, (<-jobs).Task, "t")
	// Served one after another, 8 silent clients would hold it 8 s.
	assert.Assert(t, time.Since(start) < 3*handWait, "the job waited %s behind silent clients", time.Since(start))
	select {
	case <-served:
	case <-time.After(5 * time.Second): // about linger + handWait + a tick
		t.Fatal("silent clients kept the worker past its linger")
	}
	// The silent clients were closed by the worker.
	for _, c := range silent {
		_ = c.SetDeadline(time.Now().Add(time.Second))
		n, err := c.Read(make([]byte, 16))
		assert.Assert(t, n == 0 && err != nil, "a silent client got %d bytes", n)
	}
}

// TestHandRefusesAWorkerOfAnotherUser: a socket at the worker's path
// served by another uid (a state directory opened to others, where it
// could put one) gets no job and no file: Hand checks the peer. The
// positive control: the same impostor run as this uid takes the job.
func TestHandRefusesAWorkerOfAnotherUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("needs root to run the impostor as another uid")
	}
	dir := t.TempDir()
	assert.NilError(t, os.Chmod(filepath.Dir(dir), 0o711))
	assert.NilError(t, os.Chmod(dir, 0o777))
	// The test binary where the other uid can run it.
	bin := filepath.Join(dir, "teardownd.test")
	b, err := os.ReadFile(os.Args[0])
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(bin, b, 0o755))
	impostor := func(uid int) string {
		socket := filepath.Join(dir, "teardownd-"+strconv.Itoa(uid)+".sock")
		cmd := exec.Command(bin, "-test.run=^TestImpostorWorker$")
		cmd.Env = append(os.Environ(), "SHROOMS_TEST_IMPOSTOR="+socket)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
		out, err := cmd.StdoutPipe()
		assert.NilError(t, err)
		assert.NilError(t, cmd.Start())
		// Wait for the socket.
		for i := 0; i < 500; i++ {
			if _, err := os.Lstat(socket); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		_, herr := Hand(socket, "k", Job{Task: "t"}, files(t))
		b := make([]byte, 4096)
		n := 0
		for {
			m, err := out.Read(b[n:])
			n += m
			if err != nil || n == len(b) {
				break
			}
		}
		_ = cmd.Wait()
		return fmt.Sprintf("hand: %v; impostor: %s", herr, b[:n])
	}
	own := impostor(0)
	assert.Assert(t, is.Contains(own, "hand: <nil>"), own)
	assert.Assert(t, is.Contains(own, "files 3"), own)
	other := impostor(65534)
	assert.Assert(t, is.Contains(other, "refused a peer of uid 65534"), other)
	assert.Assert(t, !strings.Contains(other, "files"), other)
}

// TestImpostorWorker is the test binary as a worker that answers any
// hello yes and prints what it got (TestHandRefusesAWorkerOfAnotherUser).
func TestImpostorWorker(t *testing.T) {
	socket := os.Getenv("SHROOMS_TEST_IMPOSTOR")
	if socket == "" {
		return
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		fmt.Println("listen:", err)
		return
	}
	defer ln.Close()
	_ = ln.SetDeadline(time.Now().Add(10 * time.Second))
	conn, err := ln.AcceptUnix()
	if err != nil {
		fmt.Println("accept:", err)
		return
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	var h hello
	if _, err := recv(conn, &h, 0); err != nil {
		fmt.Println("no hello:", err)
		return
	}
	if err := send(conn, answer{OK: true}, nil); err != nil {
		fmt.Println("answer:", err)
		return
	}
	var job Job
	fs, err := recv(conn, &job, Files)
	if err != nil {
		fmt.Println("no job:", err)
		return
	}
	fmt.Printf("job %s files %d\n", job.Task, len(fs))
}

// TestKeyFollowsTheBinaryReplaced: a new build installed at the binary's
// path (written beside it and renamed over it, as go build and install
// do), even byte for byte the same, is another key: a worker running the
// old file takes no job of the new one. The positive control: the file
// untouched gives the same key again.
func TestKeyFollowsTheBinaryReplaced(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "shrooms")
	b, err := os.ReadFile(os.Args[0])
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(bin, b, 0o755))
	k1, err := Key(bin, bin, "/c.toml", "sha256:a", "/s")
	assert.NilError(t, err)
	again, err := Key(bin, bin, "/c.toml", "sha256:a", "/s")
	assert.NilError(t, err)
	assert.Equal(t, again, k1, "positive control: the same file, the same key")
	assert.NilError(t, os.WriteFile(bin+".new", b, 0o755))
	assert.NilError(t, os.Rename(bin+".new", bin))
	k2, err := Key(bin, bin, "/c.toml", "sha256:a", "/s")
	assert.NilError(t, err)
	assert.Assert(t, k2 != k1, "a binary replaced kept the key")
}
