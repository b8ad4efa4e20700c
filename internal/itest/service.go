package itest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Service is a podman API service private to one test, on its own socket and
// the host's usual storage (so the test image is there). The test may kill
// and restart it; only the process it started is ever signalled.
type Service struct {
	t testing.TB
	// args go before `system service` (e.g. --runtime PATH).
	args []string
	dir  string
	URI  string
	cmd  *exec.Cmd
	done chan struct{}
}

// StartService starts a private podman API service (with the suites'
// runtime, ServiceArgs) and stops it when the test ends.
func StartService(t testing.TB) *Service { return StartServiceWith(t) }

// StartServiceWith starts a private podman API service with podman's
// global options args (e.g. "--runtime", "/usr/sbin/runc"); args that name
// no --runtime get the suites' runtime (ServiceArgs) first.
func StartServiceWith(t testing.TB, args ...string) *Service {
	t.Helper()
	Require(t, Root, Podman)
	if !slices.Contains(args, "--runtime") {
		args = append(ServiceArgs(), args...)
	}
	// A short path: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "shrooms-svc")
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{t: t, args: args, dir: dir, URI: "unix://" + filepath.Join(dir, "podman.sock")}
	t.Cleanup(func() {
		s.Stop()
		_ = os.RemoveAll(dir)
	})
	s.Start()
	return s
}

// Start starts the service (again) and waits until it answers.
func (s *Service) Start() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatal("podman service already running")
	}
	sock := filepath.Join(s.dir, "podman.sock")
	_ = os.Remove(sock)
	log, err := os.OpenFile(filepath.Join(s.dir, "service.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	defer log.Close()
	// As scripts/podman-service.sh: a clean environment, its own session.
	cmd := exec.Command("podman", append(append([]string{}, s.args...), "system", "service", "--time=0", s.URI)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start podman service: %v", err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(s.done)
	deadline := time.Now().Add(20 * time.Second)
	for ping(s.URI) != nil {
		if time.Now().After(deadline) {
			s.t.Fatalf("private podman service on %s did not answer in 20s: %s", s.URI, s.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill ends the service with SIGKILL, as a crash would, and waits for it.
func (s *Service) Kill() { s.signal(syscall.SIGKILL) }

// Stop ends the service with SIGTERM (SIGKILL after 10 s).
func (s *Service) Stop() { s.signal(syscall.SIGTERM) }

func (s *Service) signal(sig syscall.Signal) {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// Log returns what the service logged so far.
func (s *Service) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "service.log"))
	return string(b)
}

// Buffer is a bytes.Buffer safe for a cage's streams writing while the test
// reads.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// WaitFor polls until cond holds or fails the test after d.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
