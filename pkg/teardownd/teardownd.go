// Package teardownd is the hand-over of a turn's detached teardown to a
// teardown worker that lingers: the detached child of an earlier turn that,
// its own job done, stays for cage.teardown_linger listening on a unix
// socket in the state directory, so that the next turns' teardowns cost no
// process start and no second connection to podman.
//
// The hand-over fails closed to the known path: anything short of a worker
// of the same user that answers with the same key (binary, config, state
// directory, credentials, namespaces, working directory, environment) and
// takes the job and its files leaves the caller to start a child as
// without a worker. Once the job is sent it belongs to the worker: a
// worker that dies with it leaves what a killed child leaves.
package teardownd

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The test gates of a detached teardown (cmd/shrooms): set per turn, so
// they travel with each job and are left out of the key.
const (
	GateEnv       = "SHROOMS_TEARDOWN_GATE"
	RemoveGateEnv = "SHROOMS_TEARDOWN_REMOVE_GATE"
)

// Job is one turn's teardown: what `shrooms teardown-detached`'s flags say.
// The task lock's two files and the task's teardown.log travel beside it.
type Job struct {
	Task        string        `json:"task"`
	Agent       string        `json:"agent"`
	Cage        string        `json:"cage,omitempty"`
	Secrets     []string      `json:"secrets,omitempty"`
	PrepareNext bool          `json:"prepareNext,omitempty"`
	Worktree    string        `json:"worktree,omitempty"`
	Stdin       bool          `json:"stdin,omitempty"`
	Timeout     time.Duration `json:"timeout,omitempty"`
	Gate        string        `json:"gate,omitempty"`
	RemoveGate  string        `json:"removeGate,omitempty"`
}

// Files are the job's open files, in the order they are passed.
const Files = 3 // the task lock file, the task directory, teardown.log

// handWait bounds a hand-over: a worker that does not answer by then is
// not used (the caller starts a child).
const handWait = time.Second

// maxMsg bounds one message of the protocol.
const maxMsg = 64 << 10

type hello struct {
	Key string `json:"key"`
}

type answer struct {
	OK  bool   `json:"ok"`
	Why string `json:"why,omitempty"`
}

// Key is the digest of everything a teardown's outcome depends on besides
// its job: the binary (its path and the identity of the file at stat, the
// path a caller would start, or /proc/self/exe for the running worker),
// the config (its path, "" for the built-in defaults, and the digest of
// what was read, config.Config.Digest), the state directory, the user's
// credentials, the namespaces, the working directory (relative paths) and
// the environment (the gates aside). Equal keys: the worker does what a
// child started now would do.
func Key(binary, stat, config, configDigest, stateDir string) (string, error) {
	h := sha256.New()
	add := func(parts ...any) {
		for _, p := range parts {
			fmt.Fprintf(h, "%v\x00", p)
		}
		h.Write([]byte{'\n'})
	}
	var st unix.Stat_t
	if err := unix.Stat(stat, &st); err != nil {
		return "", fmt.Errorf("teardown worker key: %w", err)
	}
	add("binary", binary, st.Dev, st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano())
	add("config", config, configDigest)
	add("state", stateDir)
	groups, err := os.Getgroups()
	if err != nil {
		return "", fmt.Errorf("teardown worker key: %w", err)
	}
	add("creds", os.Getuid(), os.Geteuid(), os.Getgid(), os.Getegid(), groups)
	for _, ns := range []string{"cgroup", "ipc", "mnt", "net", "pid", "user", "uts"} {
		link, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			return "", fmt.Errorf("teardown worker key: %w", err)
		}
		add("ns", link)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("teardown worker key: %w", err)
	}
	add("cwd", wd)
	env := os.Environ()
	sort.Strings(env)
	for _, kv := range env {
		if !strings.HasPrefix(kv, GateEnv+"=") && !strings.HasPrefix(kv, RemoveGateEnv+"=") {
			add("env", kv)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Hand gives job and its files (Files of them) to the worker listening on
// socket if it answers with key, and returns the worker's pid. On an error
// nothing was handed over: the caller starts a child. Once Hand returned
// a pid the job is the worker's.
func Hand(socket, key string, job Job, files []*os.File) (int, error) {
	if len(files) != Files {
		return 0, fmt.Errorf("teardown worker: %d files, want %d", len(files), Files)
	}
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		return 0, fmt.Errorf("teardown worker: %w", err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(handWait)); err != nil {
		return 0, fmt.Errorf("teardown worker: %w", err)
	}
	cred, err := peer(conn)
	if err != nil {
		return 0, err
	}
	if err := send(conn, hello{Key: key}, nil); err != nil {
		return 0, err
	}
	var a answer
	if _, err := recv(conn, &a, 0); err != nil {
		return 0, err
	}
	if !a.OK {
		return 0, fmt.Errorf("teardown worker %d: %s", cred.Pid, a.Why)
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	// The commit point: a message with its files is queued whole or not at
	// all on a SOCK_SEQPACKET socket.
	if err := send(conn, job, unix.UnixRights(fds...)); err != nil {
		return 0, err
	}
	return int(cred.Pid), nil
}

// peer returns the credentials of the other end of conn, refused unless it
// is this user.
func peer(conn *net.UnixConn) (*unix.Ucred, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("teardown worker: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("teardown worker: %w", err)
	}
	if cerr != nil {
		return nil, fmt.Errorf("teardown worker: peer credentials: %w", cerr)
	}
	if int(cred.Uid) != os.Getuid() {
		return nil, fmt.Errorf("teardown worker: refused a peer of uid %d (pid %d)", cred.Uid, cred.Pid)
	}
	return cred, nil
}

func send(conn *net.UnixConn, v any, oob []byte) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("teardown worker: %w", err)
	}
	if len(b) > maxMsg {
		return fmt.Errorf("teardown worker: message of %d bytes", len(b))
	}
	n, oobn, err := conn.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return fmt.Errorf("teardown worker: %w", err)
	}
	if n != len(b) || oobn != len(oob) {
		return errors.New("teardown worker: short write")
	}
	return nil
}

// recv reads one message into v and up to nfds passed files. On an error
// the files that came are closed.
func recv(conn *net.UnixConn, v any, nfds int) ([]*os.File, error) {
	b := make([]byte, maxMsg+1)
	oob := make([]byte, unix.CmsgSpace(4*Files))
	n, oobn, flags, _, err := conn.ReadMsgUnix(b, oob)
	if err != nil {
		return nil, fmt.Errorf("teardown worker: %w", err)
	}
	var files []*os.File
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, fmt.Errorf("teardown worker: %w", err)
		}
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				unix.CloseOnExec(fd)
				files = append(files, os.NewFile(uintptr(fd), "passed"))
			}
		}
	}
	fail := func(err error) ([]*os.File, error) {
		for _, f := range files {
			f.Close()
		}
		return nil, err
	}
	switch {
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n > maxMsg:
		return fail(errors.New("teardown worker: message truncated"))
	case n == 0:
		return fail(fmt.Errorf("teardown worker: %w", syscall.ECONNRESET))
	case len(files) != nfds:
		return fail(fmt.Errorf("teardown worker: %d files passed, want %d", len(files), nfds))
	}
	if err := json.Unmarshal(b[:n], v); err != nil {
		return fail(fmt.Errorf("teardown worker: %w", err))
	}
	return files, nil
}
