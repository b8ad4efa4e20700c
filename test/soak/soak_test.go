// Package soak runs many turns of several tasks against a real podman: mixed
// agents (claude, opencode and shell HOME profiles, one with a token secret)
// and network policies (none, and a sealed allowlist that lets nothing out),
// a random `kill -9` of the shrooms process in some turns and a random `gc`
// between turns; then it asserts that nothing leaked (cages, mounts, loop
// devices, secrets, podman networks, nft set elements, and the fds and
// goroutines of a long-lived process running turns through the Go API) and
// that kept files stayed byte-identical wherever no turn changed them.
//
// `make test` runs the short form (2 tasks × 10 turns); `make soak` the full
// one (SHROOMS_SOAK_TASKS=8 SHROOMS_SOAK_TURNS=100).
package soak

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/cagelink"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// task is one soaked task and what the test expects of its HOME.
type task struct {
	id      string
	agent   string // claude, opencode, shell, tok
	sealed  bool   // runs under the sealed (allowlist) config
	inProc  bool   // runs through the Go API in this process
	readers bool   // no turn after the first changes its kept files
	// transcript is the kept session file's expected content (claude).
	transcript string
	// cred is the kept credential's digest as first seen after a reset.
	cred string
}

// The kept files each agent's turns write and read (HOME-relative).
const (
	sessionFile  = ".claude/projects/-work/0b6f5a2e-8d1c-4f3a-9e7b-2a4c6d8e0f12.jsonl"
	claudeCred   = ".claude/.credentials.json"
	opencodeCred = ".local/share/opencode/auth.json"
)

type soak struct {
	*itest.Env
	t       *testing.T
	bin     string
	none    string // config files
	sealed  string
	netName string
	client  *podman.Client
	runner  *turn.Runner
	rng     *rand.Rand
	stats   struct{ turns, kills, gcs, inproc, foreignNetns int }
}

func TestSoak(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables)
	nTasks, nTurns := envInt("SHROOMS_SOAK_TASKS", 2), envInt("SHROOMS_SOAK_TURNS", 10)
	seed := uint64(envInt("SHROOMS_SOAK_SEED", int(time.Now().UnixNano()%1_000_000)))
	t.Logf("soak: %d tasks × %d turns, seed %d (SHROOMS_SOAK_SEED to repeat)", nTasks, nTurns, seed)
	s := newSoak(t, seed)
	start := time.Now()

	var tasks []*task
	agents := []string{"claude", "opencode", "tok", "shell"}
	for i := 0; i < nTasks; i++ {
		tasks = append(tasks, &task{
			id: fmt.Sprintf("%s-%d", s.Prefix, i),
			// Every agent runs both in process and through the binary.
			agent: agents[(i/2+i)%len(agents)],
			// Task 0 runs in process (fds, goroutines), task 1 sealed
			// through the binary; then alternating.
			inProc:  i%2 == 0,
			sealed:  i%2 == 1 && (i/2)%2 == 0,
			readers: i%4 >= 2,
		})
	}

	// The seal first, as at boot; its sets are compared after the soak.
	s.cli(s.sealed, 0, "net", "apply", "--seal-only")
	setsBefore := s.nftSets()
	assert.Assert(t, setsBefore != "", "positive control: the seal's sets are listed")

	// Every task's first turn; it also warms up the in-process client and
	// runner, so fds and goroutines are counted after it.
	for _, tk := range tasks {
		s.turn(tk, 0, false)
	}
	fdBase, grBase := settledCounts(0, 0)

	for n := 1; n < nTurns; n++ {
		for _, tk := range tasks {
			// kill -9 in 10 % of all turns: only binary tasks can be killed,
			// so each of their turns is at 20 %; never the last turn, so
			// every task ends on a checked turn.
			kill := !tk.inProc && n < nTurns-1 && s.rng.IntN(100) < 20
			s.turn(tk, n, kill)
			if s.rng.IntN(100) < 5 {
				s.stats.gcs++
				s.cli(s.none, 0, "gc")
			}
		}
	}
	s.stats.gcs++
	s.cli(s.none, 0, "gc")
	wall := time.Since(start)

	// Leaks, with HOMEs still there: no cage, no secret, the seal's sets
	// unchanged, the network only the sealed one.
	assert.Equal(t, s.ourCages(), 0, "cages left")
	assert.DeepEqual(t, s.ourSecrets(), []string(nil))
	assert.Equal(t, s.nftSets(), setsBefore, "the seal's set elements changed")
	// The shrooms driver makes no podman network; its bridge stays.
	assert.DeepEqual(t, s.ourNetworks(), []string(nil))
	if s.anySealed(tasks) {
		out, err := exec.Command("ip", "-br", "link", "show", "dev", s.netName).CombinedOutput()
		assert.NilError(t, err, "the cage bridge: %s", out)
	}
	// A task's HOME (its loop device) and its outbox tmpfs may stay
	// mounted between turns, once each; nothing else of ours is mounted.
	mounts, loops := s.ourMounts(), s.ourLoops()
	allowed := map[string]bool{}
	for _, tk := range tasks {
		allowed[filepath.Join(s.Dir, "outbox", tk.id)] = true
		allowed["/volumes/shrooms-home-"+s.Prefix+"-"+tk.id+"/_data"] = true
	}
	seen := map[string]bool{}
	for _, m := range mounts {
		key := m
		if i := strings.Index(m, "/volumes/"); i >= 0 {
			key = m[i:]
		}
		assert.Assert(t, allowed[key], "unexpected mount %s", m)
		assert.Assert(t, !seen[key], "stacked mount %s", m)
		seen[key] = true
	}
	assert.Assert(t, len(loops) <= len(tasks), "loop devices: %v", loops)
	fd, gr := settledCounts(fdBase, grBase)
	t.Logf("in-process: fds %d → %d, goroutines %d → %d", fdBase, fd, grBase, gr)
	assert.Check(t, fd <= fdBase+4, "fds leaked: %d → %d", fdBase, fd)
	if gr > grBase+4 {
		var dump bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&dump, 2)
		ents, _ := os.ReadDir("/proc/self/fd")
		var links []string
		for _, e := range ents {
			l, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
			links = append(links, l)
		}
		t.Errorf("goroutines leaked: %d → %d; fds %v\n%s", grBase, gr, links, dump.String())
	}

	// forget reclaims everything of every task.
	for _, tk := range tasks {
		cfg := s.none
		if tk.sealed {
			cfg = s.sealed
		}
		s.cli(cfg, 0, "forget", "--task", tk.id)
	}
	assert.DeepEqual(t, s.ourMounts(), []string(nil))
	assert.DeepEqual(t, s.ourLoops(), []string(nil))
	assert.DeepEqual(t, s.ourVolumes(), []string(nil))
	t.Logf("soak figures: turns %d (in-process %d), kill -9 %d, gc %d, wall %s; podman listings retried for a foreign netns: %d",
		s.stats.turns, s.stats.inproc, s.stats.kills, s.stats.gcs, wall.Round(time.Second), s.stats.foreignNetns)
}

func newSoak(t *testing.T, seed uint64) *soak {
	// Every task is forgotten when the test ends; the cages a failed soak
	// left are removed quietly (a passing one left nothing: checked by the
	// test itself).
	e := itest.New(t, "sk", itest.WithForget(), itest.WithPrepared())
	dir := e.Dir
	s := &soak{Env: e, t: t, bin: itest.ShroomsBinary(t), rng: rand.New(rand.NewPCG(seed, 17))}
	s.netName = s.Prefix
	tokenFile := filepath.Join(dir, "token")
	assert.NilError(t, os.WriteFile(tokenFile, []byte("soak-token-value\n"), 0o600))
	// A subnet no other test process on the machine has (podman's network
	// configs are the machine's).
	sub4, _ := itest.Subnets(t)
	common := fmt.Sprintf(`
[podman]
socket = %q
[state]
dir = %q
[cage]
image = %q
memory = "256m"
timeout = "30s"
stop_grace = "1s"
# A prepared cage waits on purpose: the leak check below counts none.
prepare_next = false
[worktree]
uncapped = "allow"
[home]
volume_prefix = "shrooms-home-%s-"
size = "64m"
inodes = 4096
[outbox]
root = %q
size = "4m"
[tokens]
soak = %q
[agents.claude]
command = ["/bin/sh"]
home = ["claude", "shell"]
[agents.opencode]
command = ["/bin/sh"]
home = ["opencode", "shell"]
[agents.tok]
command = ["/bin/sh"]
home = ["shell"]
token_env = { SOAK_TOKEN = "soak" }
`, itest.Socket(), filepath.Join(dir, "state"), itest.TestImage, s.Prefix, filepath.Join(dir, "outbox"), tokenFile)
	s.none = filepath.Join(dir, "none.toml")
	assert.NilError(t, os.WriteFile(s.none, []byte(common+"[network]\npolicy = \"none\"\n"), 0o600))
	s.sealed = filepath.Join(dir, "sealed.toml")
	// An allowlist with nothing on it: the cage has a network, the seal
	// lets nothing out (the soak sends no packets anyway).
	assert.NilError(t, os.WriteFile(s.sealed, []byte(common+fmt.Sprintf(`[network]
policy = "allowlist"
allow = []
name = %q
bridge = %q
subnet4 = %q
subnet6 = ""
`, s.netName, s.netName, sub4)), 0o600))

	cfg, err := config.Load(s.none)
	assert.NilError(t, err)
	s.client, err = podman.Connect(context.Background(), cfg.Podman.Socket)
	assert.NilError(t, err)
	s.runner = turn.NewRunner(cfg, s.client, nil)
	e.Config = s.none
	e.Release = func(_ context.Context, task taskid.ID) error {
		_, _, _ = e.CLI("forget", "--task", task.String())
		return nil
	}
	e.Finally(func() {
		_ = exec.Command(s.bin, "--config", s.sealed, "net", "flush").Run()
		_, _ = e.Podman("network", "rm", "-f", s.netName)
		for _, fam := range []string{"inet", "bridge"} {
			_ = exec.Command("nft", "delete", "table", fam, "shrooms_"+s.netName).Run()
		}
		_ = exec.Command("nft", "delete", "table", "inet", cagelink.NATTable(s.netName)).Run()
		_ = exec.Command("ip", "link", "delete", "dev", s.netName, "type", "bridge").Run()
	})
	return s
}

// cli runs the shrooms binary and checks its exit code. A podman listing
// that trips over another test's network namespace on this shared host
// ("unknown FS magic on /run/netns/…", not ours) is retried.
func (s *soak) cli(cfg string, want int, args ...string) string {
	s.t.Helper()
	var cmd *exec.Cmd
	var out, errb bytes.Buffer
	for try := 0; try < 30; try++ {
		cmd = exec.Command(s.bin, append([]string{"--config", cfg}, args...)...)
		out.Reset()
		errb.Reset()
		cmd.Stdout, cmd.Stderr = &out, &errb
		_ = cmd.Run()
		if !foreignNetns(errb.String()) {
			break
		}
		s.stats.foreignNetns++
		time.Sleep(2 * time.Second)
	}
	assert.Equal(s.t, cmd.ProcessState.ExitCode(), want, "shrooms %v: %s%s", args, out.String(), errb.String())
	return out.String()
}

// script is one turn: it checks that the reset removed the previous turn's
// junk, reports the digests of the kept files, plants junk again, changes
// the kept session (unless read-only) and exits with code.
func script(tk *task, n int, write bool, slow bool, code int) string {
	var b strings.Builder
	b.WriteString("cd ~\n[ -e junk ] && echo JUNK-SURVIVED\n[ -e .config/evil ] && echo JUNK-SURVIVED\n")
	switch tk.agent {
	case "claude":
		fmt.Fprintf(&b, "echo KEPT $(cat %s 2>/dev/null | md5sum)\necho CRED $(cat %s 2>/dev/null | md5sum)\n", sessionFile, claudeCred)
	case "opencode":
		fmt.Fprintf(&b, "echo CRED $(cat %s 2>/dev/null | md5sum)\n", opencodeCred)
	case "tok":
		b.WriteString("[ \"$SOAK_TOKEN\" = soak-token-value ] && echo TOKEN-OK\n")
	}
	if slow {
		b.WriteString("sleep 2\n")
	}
	b.WriteString("echo junk > junk; mkdir -p .config && echo '{}' > .config/evil\necho out > /outbox/f\n")
	if write {
		switch tk.agent {
		case "claude":
			fmt.Fprintf(&b, "mkdir -p $(dirname %s)\necho '%s' >> %s\n", sessionFile, soakRecord(n), sessionFile)
			if n == 0 {
				fmt.Fprintf(&b, "echo '{\"claudeAiOauth\":{\"accessToken\":\"a%d\",\"expiresAt\":1}}' > %s\n", n, claudeCred)
			}
		case "opencode":
			if n == 0 {
				fmt.Fprintf(&b, "mkdir -p $(dirname %s)\necho '{\"anthropic\":{\"type\":\"api\",\"key\":\"k%d\"}}' > %s\n", opencodeCred, n, opencodeCred)
			}
		}
	}
	fmt.Fprintf(&b, "exit %d\n", code)
	return b.String()
}

// soakRecord is turn n's line of the kept transcript: a user message in the
// form the reset's record-level rebuild writes (keys sorted, compact), so a
// rebuild keeps it byte for byte.
func soakRecord(n int) string {
	return fmt.Sprintf(`{"message":{"content":"turn %d","role":"user"},"type":"user","uuid":"soak-turn-%d"}`, n, n)
}

// foreignNetns reports podman failing to list containers because of
// another test's network namespace on this shared host.
func foreignNetns(msg string) bool { return strings.Contains(msg, "unknown FS magic on \"/run/netns/") }

func md5hex(s string) string {
	h := md5.Sum([]byte(s))
	return hex.EncodeToString(h[:]) + " -" // as `echo $(md5sum)` prints it
}

// turn runs turn n of tk (killing shrooms at a random moment if kill) and
// checks what it reported against the model of its HOME.
func (s *soak) turn(tk *task, n int, kill bool) {
	t := s.t
	t.Helper()
	s.stats.turns++
	write := n == 0 || (!tk.readers && s.rng.IntN(2) == 0)
	if kill {
		write = false // a killed turn's changes would be unknown
	}
	code := s.rng.IntN(10)
	sc := script(tk, n, write, kill, code)
	var out string
	if tk.inProc {
		s.stats.inproc++
		var o, e bytes.Buffer
		var res *turn.Result
		var err error
		for try := 0; try < 30; try++ {
			o.Reset()
			e.Reset()
			res, err = s.runner.Run(context.Background(), turn.Request{Task: taskid.Must(tk.id), Agent: tk.agent, Args: []string{"-c", sc},
				Streams: podman.Streams{Stdout: &o, Stderr: &e}})
			if err == nil || !foreignNetns(err.Error()) || res.Cage != "" {
				break
			}
			s.stats.foreignNetns++
			time.Sleep(2 * time.Second)
		}
		assert.NilError(t, err, "task %s turn %d: %s", tk.id, n, e.String())
		assert.Equal(t, res.Status, "exited", res.Error)
		assert.Equal(t, res.ExitCode, code, "task %s turn %d: %s", tk.id, n, e.String())
		assert.Assert(t, res.Removed, res.Error)
		out = o.String()
	} else {
		cfg := s.none
		if tk.sealed {
			cfg = s.sealed
		}
		var cmd *exec.Cmd
		var o, e bytes.Buffer
		for try := 0; ; try++ {
			cmd = exec.Command(s.bin, "--config", cfg, "--json", "run", "--task", tk.id, "--agent", tk.agent, "--no-stdin", "--", "-c", sc)
			o.Reset()
			e.Reset()
			cmd.Stdout, cmd.Stderr = &o, &e
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			assert.NilError(t, cmd.Start())
			if kill {
				break
			}
			_ = cmd.Wait()
			// Refused before its cage existed, for a foreign netns: again.
			if try >= 30 || !foreignNetns(e.String()) || strings.Contains(o.String(), `"cage":"`) {
				break
			}
			s.stats.foreignNetns++
			time.Sleep(2 * time.Second)
		}
		if kill {
			// Anywhere from HOME reset through the running cage.
			time.Sleep(time.Duration(s.rng.IntN(1500)) * time.Millisecond)
			if cmd.Process.Signal(syscall.SIGKILL) == nil {
				s.stats.kills++
			}
			_ = cmd.Wait()
			return
		}
		assert.Equal(t, cmd.ProcessState.ExitCode(), code, "task %s turn %d: %s%s", tk.id, n, o.String(), e.String())
		lines := strings.Split(strings.TrimSpace(o.String()), "\n")
		var res turn.Result
		assert.NilError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res), o.String())
		assert.Equal(t, res.Status, "exited", res.Error)
		// Removed by the turn, or by its detached teardown (the task's
		// next turn and the leak check wait for it).
		assert.Assert(t, res.Removed || res.Teardown == "detached", res.Error)
		out = strings.Join(lines[:len(lines)-1], "\n") + "\n"
	}
	assert.Assert(t, !strings.Contains(out, "JUNK-SURVIVED"), "task %s turn %d: the reset kept junk:\n%s", tk.id, n, out)
	switch tk.agent {
	case "claude":
		assert.Equal(t, field(out, "KEPT"), md5hex(tk.transcript), "task %s turn %d: session file changed", tk.id, n)
		s.checkCred(tk, n, out)
		if write {
			tk.transcript += soakRecord(n) + "\n"
		}
	case "opencode":
		s.checkCred(tk, n, out)
	case "tok":
		assert.Assert(t, strings.Contains(out, "TOKEN-OK"), "task %s turn %d: token missing:\n%s", tk.id, n, out)
	}
}

// checkCred: from the first turn after the one that wrote it, the kept
// credential (rebuilt from its allowlist every reset) is byte-identical.
func (s *soak) checkCred(tk *task, n int, out string) {
	got := field(out, "CRED")
	if n == 0 {
		assert.Equal(s.t, got, md5hex(""), "task %s: a credential before the first turn", tk.id)
		return
	}
	if tk.cred == "" {
		assert.Assert(s.t, got != md5hex(""), "task %s turn %d: the credential was not kept", tk.id, n)
		tk.cred = got
		return
	}
	assert.Equal(s.t, got, tk.cred, "task %s turn %d: the kept credential changed", tk.id, n)
}

func field(out, name string) string {
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	return ""
}

// settledCounts returns this process's open fds and goroutines once they
// stop falling (teardown runs off the caller's path), at most 10 s.
func settledCounts(fdBase, grBase int) (fds, grs int) {
	for i := 0; i < 50; i++ {
		runtime.GC()
		ents, _ := os.ReadDir("/proc/self/fd")
		fds, grs = len(ents), runtime.NumGoroutine()
		if fdBase > 0 && fds <= fdBase && grs <= grBase {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	return
}

func (s *soak) anySealed(tasks []*task) bool {
	for _, tk := range tasks {
		if tk.sealed {
			return true
		}
	}
	return false
}

func (s *soak) ourCages() int {
	cages, err := s.client.ListByLabel(context.Background(), sealed.LabelManaged, "1")
	for try := 0; err != nil && foreignNetns(err.Error()) && try < 30; try++ {
		s.stats.foreignNetns++
		time.Sleep(2 * time.Second)
		cages, err = s.client.ListByLabel(context.Background(), sealed.LabelManaged, "1")
	}
	assert.NilError(s.t, err)
	n := 0
	for _, c := range cages {
		if strings.HasPrefix(c.Labels[sealed.LabelTask], s.Prefix) {
			n++
		}
	}
	return n
}

func (s *soak) podmanList(args ...string) []string {
	out, err := exec.Command("podman", append([]string{"--url", itest.Socket()}, args...)...).CombinedOutput()
	assert.NilError(s.t, err, "podman %v: %s", args, out)
	var mine []string
	for _, l := range strings.Fields(string(out)) {
		if strings.Contains(l, s.Prefix) {
			mine = append(mine, l)
		}
	}
	sort.Strings(mine)
	return mine
}

func (s *soak) ourSecrets() []string  { return s.podmanList("secret", "ls", "--format", "{{.Name}}") }
func (s *soak) ourNetworks() []string { return s.podmanList("network", "ls", "--format", "{{.Name}}") }
func (s *soak) ourVolumes() []string  { return s.podmanList("volume", "ls", "--format", "{{.Name}}") }

// ourMounts lists mount points of ours: under the soak's directory or a
// HOME volume of its tasks.
func (s *soak) ourMounts() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	assert.NilError(s.t, err)
	var mine []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && (strings.HasPrefix(f[4], s.Dir) || strings.Contains(f[4], "shrooms-home-"+s.Prefix)) {
			mine = append(mine, f[4])
		}
	}
	return mine
}

// ourLoops lists loop devices backed by a file in the soak's directory.
func (s *soak) ourLoops() []string {
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").CombinedOutput()
	assert.NilError(s.t, err, "%s", out)
	var mine []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, s.Dir) {
			mine = append(mine, strings.TrimSpace(l))
		}
	}
	return mine
}

// nftSets is the seal's sets with their elements, as nft lists them.
func (s *soak) nftSets() string {
	var all []string
	for _, fam := range []string{"inet", "bridge"} {
		out, err := exec.Command("nft", "list", "table", fam, "shrooms_"+s.netName).CombinedOutput()
		if err != nil {
			continue
		}
		// Only sets: counters in rules change with traffic.
		in := false
		for _, l := range strings.Split(string(out), "\n") {
			tl := strings.TrimSpace(l)
			if strings.HasPrefix(tl, "set ") {
				in = true
			}
			if in {
				all = append(all, tl)
			}
			if in && tl == "}" {
				in = false
			}
		}
	}
	return strings.Join(all, "\n")
}
