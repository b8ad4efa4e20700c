package probe

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// sentryIDReason is the reason the inside gives A5 under gVisor: only the
// host side can decide it (JudgeSandbox).
const sentryIDReason = "under gVisor the cage sees the Sentry's id map; only the host sees whether runsc-sandbox and runsc-gofer run as the task's ids"

// sandboxProc is one runsc process (runsc re-executes itself with argv[0]
// runsc-sandbox or runsc-gofer) as the host saw it, last.
type sandboxProc struct {
	Pid      int
	Name     string
	Cmdline  string
	UID, GID []string // real, effective, saved, filesystem
}

// sandboxWatch records, while a probe's cage runs, the host ids of every
// runsc sandbox and gofer process on this host (the cage's is picked by
// its id afterwards). A remote podman service's are out of sight: A5 then
// stays undecided under gVisor.
type sandboxWatch struct {
	mu    sync.Mutex
	procs map[int]sandboxProc
	stop  chan struct{}
	done  chan struct{}
}

func watchSandboxes(every time.Duration) *sandboxWatch {
	w := &sandboxWatch{procs: map[int]sandboxProc{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			w.scan()
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *sandboxWatch) scan() {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmd, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		name, _, _ := strings.Cut(string(cmd), "\x00")
		if name != "runsc-sandbox" && name != "runsc-gofer" {
			continue
		}
		st, err := os.ReadFile(filepath.Join(d, "status"))
		if err != nil {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		p := sandboxProc{Pid: pid, Name: name, Cmdline: strings.ReplaceAll(string(cmd), "\x00", " ")}
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, "Uid:"); ok {
				p.UID = strings.Fields(v)
			} else if v, ok := strings.CutPrefix(l, "Gid:"); ok {
				p.GID = strings.Fields(v)
			}
		}
		w.mu.Lock()
		w.procs[pid] = p
		w.mu.Unlock()
	}
}

// Stop ends the watch and returns what it saw (nil-safe).
func (w *sandboxWatch) Stop() []sandboxProc {
	if w == nil {
		return nil
	}
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []sandboxProc
	for _, p := range w.procs {
		out = append(out, p)
	}
	return out
}

// judgeSandbox decides A5 when the inside left it to the host (the cage
// saw the Sentry's id map): sealed when the cage's runsc-sandbox and
// runsc-gofer were seen running with every uid and gid the task's range
// base (not host root), escaped when one ran with other ids, undecided
// (the inside's error) when the host saw neither.
func judgeSandbox(rep *Report, cage string, procs []sandboxProc, ids taskstate.IDs, idsErr error) {
	for i := range rep.Checks {
		c := &rep.Checks[i]
		if c.ID != SandboxRow || c.Verdict != Error || c.Reason != sentryIDReason {
			continue
		}
		if cage == "" {
			return
		}
		if idsErr != nil {
			c.ev("host: the task's ids: %v", idsErr)
			return
		}
		uid, gid := strconv.FormatUint(uint64(ids.UID), 10), strconv.FormatUint(uint64(ids.GID), 10)
		seen := map[string]bool{}
		bad := false
		for _, p := range procs {
			if !strings.Contains(p.Cmdline, cage) {
				continue
			}
			seen[p.Name] = true
			ok := ids.UID != 0 && ids.GID != 0 && all(p.UID, uid) && all(p.GID, gid)
			c.ev("host: %s pid %d runs as uid %s gid %s (the task's range base: %s:%s)", p.Name, p.Pid, strings.Join(p.UID, ","), strings.Join(p.GID, ","), uid, gid)
			if !ok {
				bad = true
				c.ev("ESCAPED: %s of the cage runs with host ids other than the task's", p.Name)
			}
		}
		switch {
		case bad:
			c.Verdict, c.Reason = Escaped, ""
		case seen["runsc-sandbox"] && seen["runsc-gofer"]:
			c.Verdict, c.Reason = Sealed, ""
			c.ev("the task's user namespace holds on the host: the Sentry and its gofer run as the task's ids, as the cage's processes do under runc")
		default:
			c.ev("host: no runsc-sandbox and runsc-gofer of cage %.12s seen (%s): a podman service out of this host's sight", cage, fmt.Sprint(len(procs))+" runsc processes seen")
		}
		return
	}
}

func all(vals []string, want string) bool {
	if len(vals) == 0 {
		return false
	}
	for _, v := range vals {
		if v != want {
			return false
		}
	}
	return true
}
