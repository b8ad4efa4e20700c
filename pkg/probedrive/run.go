// Package probedrive is the host side of shrooms' breakout battery
// (pkg/probe): it finds the targets the battery aims at from the host's own
// network (Discover, InternetFor), runs `shrooms probe inside` as a turn of
// the pipeline with this executable mounted read-only (Run), with a peer
// cage for D8, the host's kernel release for B10 and, under gVisor, the
// host ids of the cage's runsc processes for A5, dials the cage for D15
// (DialInbound) and hands back the battery's report.
package probedrive

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/mounts"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/probe"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// Options is one run of the battery in a cage.
type Options struct {
	// Task and Agent name the turn (the agent's image and HOME are used;
	// its command is replaced by the probe).
	Task  taskid.ID
	Agent string
	// Params go to the inside as they are.
	Params probe.Params
	// Binary is the static shrooms executable to mount (default: this one).
	Binary string
	// Timeout bounds the turn (default 2 minutes).
	Timeout time.Duration
	// Stderr receives the cage's stderr (may be nil).
	Stderr io.Writer
	// OnInbound, when set, is called (in its own goroutine) with each
	// address the inside listens on for D15, so the caller can try to
	// connect to the cage while the battery runs.
	OnInbound func(addr string, port int)
	// Peer starts a peer cage (task Task+"-peer") for D8 when Params name
	// no peers, and removes it after the battery.
	Peer bool
}

// Run runs the battery in a fresh cage of r and returns its report. The
// turn result is returned too (cage id, exit code, phases) when there is one.
func Run(ctx context.Context, r *turn.Runner, o Options) (*probe.Report, *turn.Result, error) {
	bin := o.Binary
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, nil, fmt.Errorf("probe: find own executable: %w", err)
		}
		bin = exe
	}
	bin, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return nil, nil, fmt.Errorf("probe: binary: %w", err)
	}
	if fi, err := os.Stat(bin); err != nil || !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("probe: %s is not a regular file", bin)
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	if o.Peer && len(o.Params.Peers) == 0 {
		peers, stop, err := startPeer(ctx, r, o, bin, timeout)
		if err != nil {
			return nil, nil, err
		}
		defer stop()
		o.Params.Peers = peers
	}
	if o.Params.HostKernel == "" {
		o.Params.HostKernel = hostKernel()
	}
	params, err := json.Marshal(o.Params)
	if err != nil {
		return nil, nil, fmt.Errorf("probe: params: %w", err)
	}
	var stdout bytes.Buffer
	stderr := &announceWriter{next: o.Stderr, on: o.OnInbound}
	// Under gVisor only the host sees the task's ids (A5): watch the runsc
	// processes while the cage runs.
	watch := watchSandboxes(200 * time.Millisecond)
	res, err := r.Run(ctx, turn.Request{
		Task:    o.Task,
		Agent:   o.Agent,
		Command: append(append([]string{probe.BinaryPath}, probe.InsideArgs...), probe.ParamsFlag, string(params)),
		ExtraMounts: []mounts.Mount{{
			Kind: mounts.Bind, Source: bin, Dest: probe.BinaryPath, ReadOnly: true,
			Options: []string{"rbind", "nosuid", "nodev"},
		}},
		Timeout: timeout,
		Streams: podman.Streams{Stdout: &stdout, Stderr: stderr},
	})
	stderr.wait()
	sandboxes := watch.Stop()
	if err != nil {
		return nil, res, fmt.Errorf("probe: turn: %w", err)
	}
	rep, perr := probe.Parse(lastJSON(stdout.Bytes()))
	if perr != nil {
		return nil, res, fmt.Errorf("probe: cage exited %d without a report: %w (stderr: %s)", res.ExitCode, perr, strings.Join(strings.Fields(stderr.tail()), " "))
	}
	ids, idsErr := r.Store.TaskIDs(o.Task, r.IDFiles, false)
	probe.JudgeSandbox(rep, res.Cage, sandboxes, ids.UID, ids.GID, idsErr)
	if res.SealDigest != "" {
		rep.Walls = &probe.Walls{HostSeal: res.SealDigest, Rules: res.SealRules}
		if res.CageWall != nil {
			w := probe.WallStatus(*res.CageWall)
			rep.Walls.CageWall = &w
		}
		rep.Walls.Agree = res.CageWall != nil && res.CageWall.OK && res.SealRules != "" && res.CageWall.Rules == res.SealRules
	}
	return rep, res, nil
}

// startPeer runs a peer cage of the task's agent (another turn, task
// Task+"-peer") until stop, and returns the addresses it announced.
func startPeer(ctx context.Context, r *turn.Runner, o Options, bin string, timeout time.Duration) ([]string, func(), error) {
	peer, err := taskid.Parse(o.Task.String() + "-peer")
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", turn.ErrInput, err)
	}
	pctx, cancel := context.WithCancel(ctx)
	found := make(chan []string, 1)
	w := &announceWriter{onLine: func(f []string) {
		if len(f) > 1 && f[0] == probe.PeerAnnounce {
			select {
			case found <- f[1:]:
			default:
			}
		}
	}}
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(pctx, turn.Request{
			Task: peer, Agent: o.Agent,
			Command: append(append([]string{probe.BinaryPath}, probe.InsideArgs...), probe.PeerArg),
			ExtraMounts: []mounts.Mount{{
				Kind: mounts.Bind, Source: bin, Dest: probe.BinaryPath, ReadOnly: true,
				Options: []string{"rbind", "nosuid", "nodev"},
			}},
			Timeout: timeout + time.Minute,
			Streams: podman.Streams{Stderr: w},
		})
		done <- err
	}()
	stop := func() { cancel(); <-done }
	select {
	case peers := <-found:
		return peers, stop, nil
	case err := <-done:
		cancel()
		return nil, nil, fmt.Errorf("probe: peer cage ended before it announced its addresses: %v", err)
	case <-time.After(time.Minute):
		stop()
		return nil, nil, fmt.Errorf("probe: peer cage did not announce its addresses within a minute")
	}
}

// hostKernel is uname's release of the host's kernel (Params.HostKernel).
func hostKernel() string {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return ""
	}
	return string(bytes.TrimRight(uts.Release[:], "\x00"))
}

// lastJSON is the last line of out that looks like a JSON object.
func lastJSON(out []byte) []byte {
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		if bytes.HasPrefix(bytes.TrimSpace(lines[i]), []byte("{")) {
			return lines[i]
		}
	}
	return out
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// announceWriter passes the cage's stderr on and reacts to D15 announces.
type announceWriter struct {
	next   io.Writer
	on     func(string, int)
	onLine func([]string) // every line, split into fields
	mu     sync.Mutex
	buf    []byte
	last   []byte
	wg     sync.WaitGroup
}

func (a *announceWriter) Write(p []byte) (int, error) {
	a.mu.Lock()
	a.buf = append(a.buf, p...)
	a.last = append(a.last, p...)
	if len(a.last) > 4096 {
		a.last = a.last[len(a.last)-4096:]
	}
	for {
		i := bytes.IndexByte(a.buf, '\n')
		if i < 0 {
			break
		}
		line := string(a.buf[:i])
		a.buf = a.buf[i+1:]
		f := strings.Fields(line)
		if a.onLine != nil {
			a.onLine(f)
		}
		if len(f) == 3 && f[0] == probe.InboundAnnounce && a.on != nil {
			port, _ := strconv.Atoi(f[2])
			a.wg.Add(1)
			go func() { defer a.wg.Done(); a.on(f[1], port) }()
		}
	}
	a.mu.Unlock()
	if a.next != nil {
		return a.next.Write(p)
	}
	return len(p), nil
}

func (a *announceWriter) wait() { a.wg.Wait() }

func (a *announceWriter) tail() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return string(a.last)
}
