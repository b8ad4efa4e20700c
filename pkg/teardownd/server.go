package teardownd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrTaken: another process is the state directory's worker.
var ErrTaken = errors.New("teardown worker: another process serves this state directory")

// tick is how often an idle worker looks at the clock and its socket.
const tick = 500 * time.Millisecond

// Server is this process as the state directory's teardown worker.
type Server struct {
	ln     *net.UnixListener
	lock   *os.File
	socket string
	ino    uint64
	jobs   sync.WaitGroup

	mu     sync.Mutex
	active int
	idle   time.Time // since when no job runs
}

// Listen makes this process the worker of the state directory that holds
// socket and lock (taskstate.Layout's TeardownSocket and TeardownWorker):
// it flocks lock for its lifetime (ErrTaken when another worker holds it),
// writes its pid there, and listens on socket. The directory must be this
// user's and closed to others (0700): the socket is the only way in, and
// every peer's uid is checked besides.
func Listen(socket, lock string) (*Server, error) {
	dir := filepath.Dir(socket)
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return nil, fmt.Errorf("teardown worker: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Getuid() || st.Mode&0o077 != 0 {
		return nil, fmt.Errorf("teardown worker: %s is not a directory of uid %d closed to others (mode %#o)", dir, os.Getuid(), st.Mode&0o7777)
	}
	f, err := os.OpenFile(lock, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("teardown worker: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrTaken
		}
		return nil, fmt.Errorf("teardown worker: %w", err)
	}
	s := &Server{lock: f, socket: socket, idle: time.Now()}
	if err := s.listen(); err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

func (s *Server) listen() error {
	if err := s.lock.Truncate(0); err != nil {
		return fmt.Errorf("teardown worker: %w", err)
	}
	if _, err := s.lock.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		return fmt.Errorf("teardown worker: %w", err)
	}
	// A socket left by a worker that died: the lock says none listens.
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("teardown worker: %w", err)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: s.socket, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("teardown worker: %w", err)
	}
	var st unix.Stat_t
	if err := os.Chmod(s.socket, 0o600); err == nil {
		err = unix.Lstat(s.socket, &st)
	}
	if err != nil {
		ln.Close()
		return fmt.Errorf("teardown worker: %w", err)
	}
	s.ln, s.ino = ln, st.Ino
	return nil
}

// Begin counts a job this process runs besides those it is handed (its
// own, as the child it started as): the worker does not end while it runs.
func (s *Server) Begin() (done func()) {
	s.mu.Lock()
	s.active++
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.active--; s.active == 0 {
				s.idle = time.Now()
			}
			s.mu.Unlock()
		})
	}
}

// Serve takes jobs whose hello carries key, each run by run in a goroutine
// of its own (run owns the files: the task lock's two and its
// teardown.log), until no job has run for linger, ctx is done, or the
// socket is no longer this worker's (the state directory removed). Then
// it stops listening, waits for the jobs that run, and lets the state
// directory go.
func (s *Server) Serve(ctx context.Context, key string, linger time.Duration, run func(Job, []*os.File)) {
	defer s.lock.Close()
	for ctx.Err() == nil && !s.done(linger) {
		_ = s.ln.SetDeadline(time.Now().Add(tick))
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				time.Sleep(tick) // EMFILE and the like: not a busy loop
			}
			continue
		}
		endJob := s.Begin()
		s.jobs.Add(1)
		go func() {
			defer s.jobs.Done()
			defer endJob()
			s.serve(conn, key, run)
		}()
	}
	s.ln.Close() // removes the socket
	s.jobs.Wait()
}

// done: idle for linger, or the socket gone or replaced.
func (s *Server) done(linger time.Duration) bool {
	var st unix.Stat_t
	if err := unix.Lstat(s.socket, &st); err != nil || st.Ino != s.ino {
		s.ln.SetUnlinkOnClose(false)
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active == 0 && time.Since(s.idle) >= linger
}

// serve answers one connection: a peer of this user with the same key
// gets its job run; any other is closed with nothing done.
func (s *Server) serve(conn *net.UnixConn, key string, run func(Job, []*os.File)) {
	defer conn.Close()
	if conn.SetDeadline(time.Now().Add(handWait)) != nil {
		return
	}
	if _, err := peer(conn); err != nil {
		return
	}
	var h hello
	if _, err := recv(conn, &h, 0); err != nil {
		return
	}
	if h.Key != key {
		_ = send(conn, answer{Why: "another binary, config, state directory or environment"}, nil)
		return
	}
	// The caller sends the job right after reading this; once it has, the
	// job is this worker's: wait for it longer than the caller waits.
	if send(conn, answer{OK: true}, nil) != nil || conn.SetDeadline(time.Now().Add(30*time.Second)) != nil {
		return
	}
	var job Job
	files, err := recv(conn, &job, Files)
	if err != nil {
		return
	}
	conn.Close()
	run(job, files)
}

// Running returns the pid of the worker that holds lock (a state
// directory's TeardownWorker), 0 when none does.
func Running(lock string) int {
	f, err := os.Open(lock)
	if err != nil {
		return 0
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err == nil {
		return 0 // released with the file
	}
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	return pid
}
