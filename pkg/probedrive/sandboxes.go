package probedrive

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/probe"
)

// sandboxWatch records, while a probe's cage runs, the host ids of every
// runsc sandbox and gofer process on this host (the cage's is picked by
// its id afterwards). A remote podman service's are out of sight: A5 then
// stays undecided under gVisor.
type sandboxWatch struct {
	mu    sync.Mutex
	procs map[int]probe.SandboxProc
	stop  chan struct{}
	done  chan struct{}
}

func watchSandboxes(every time.Duration) *sandboxWatch {
	w := &sandboxWatch{procs: map[int]probe.SandboxProc{}, stop: make(chan struct{}), done: make(chan struct{})}
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
		p := probe.SandboxProc{Pid: pid, Name: name, Cmdline: strings.ReplaceAll(string(cmd), "\x00", " ")}
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
func (w *sandboxWatch) Stop() []probe.SandboxProc {
	if w == nil {
		return nil
	}
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []probe.SandboxProc
	for _, p := range w.procs {
		out = append(out, p)
	}
	return out
}
