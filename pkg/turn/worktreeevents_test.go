package turn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/engine"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/worktree/diff"
)

// eventsTree lays out the same worktree, owned by 4242, at each of dirs:
// files, directories to move and remove, a hard-linked pair, a nested
// repository and agent config.
func eventsTree(t *testing.T, dirs ...string) {
	t.Helper()
	for _, wt := range dirs {
		files := map[string]string{
			"src/main.go": "package main\n", "src/util/u.go": "package util\n",
			"notes/a.md": "a", "notes/old/b.md": "b", "notes/old/deep/c.md": "c",
			"gone/x/y.txt": "y", "gone/z.txt": "z", "stamp.txt": "12345",
			"vendor/lib/.git/HEAD": "ref: refs/heads/main\n", "AGENTS.md": "be nice\n",
			"linked.txt": "one inode",
		}
		for rel, data := range files {
			p := filepath.Join(wt, rel)
			assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
			assert.NilError(t, os.WriteFile(p, []byte(data), 0o644))
		}
		assert.NilError(t, os.Link(filepath.Join(wt, "linked.txt"), filepath.Join(wt, "notes", "linked-too.txt")))
		assert.NilError(t, filepath.Walk(wt, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, 4242, 4242)
		}))
	}
}

// changed is a report without its timing and how it was read.
func changed(t *testing.T, res *Result) diff.Summary {
	t.Helper()
	assert.Assert(t, res.WorktreeChanges != nil && res.WorktreeChanges.Summary != nil, "%+v", res.WorktreeChanges)
	s := *res.WorktreeChanges.Summary
	s.ScanMS, s.ScanAfter, s.ScanBefore, s.DirsRevalidated, s.DirsRelisted, s.DirsStatted, s.DirsStatShared = 0, "", "", 0, 0, 0, 0
	return s
}

// TestWorktreeChangesFromEventsAreTheWalks: the same turns in two copies
// of one worktree, one task reading the turn's fanotify events after it,
// the other walking the whole tree: the reports are equal, for a turn
// that exits, one past its deadline, and one after the owner changed the
// worktree between turns (not the turn's); a moved directory changed
// inside, a removed tree, a rewrite with size and mtime put back, hard
// links, a link swap and a new nested repository are all in them. (The
// owner's nested repository stays the owner's: read-only in the cage.)
func TestWorktreeChangesFromEventsAreTheWalks(t *testing.T) {
	e, runner := newHarness(t, "")
	base := t.TempDir()
	runner.Cfg.Worktree.Roots = []string{base}
	ev, walk := filepath.Join(base, "ev"), filepath.Join(base, "walk")
	eventsTree(t, ev, walk)
	type turnOf func(wt string, walkAfter bool) *Result
	run := func(timeout time.Duration, script string) turnOf {
		return func(wt string, walkAfter bool) *Result {
			runner.walkAfter, runner.walkBefore = walkAfter, walkAfter
			defer func() { runner.walkAfter, runner.walkBefore = false, false }()
			var out, errb bytes.Buffer
			res, err := runner.Run(context.Background(), Request{
				Task: taskid.Must(e.Task(fmt.Sprint("ev", walkAfter))), Agent: "shell", Worktree: wt,
				Args: []string{"-c", script}, Timeout: timeout,
				Streams: podman.Streams{Stdout: &out, Stderr: &errb},
			})
			if timeout > 0 {
				assert.Assert(t, errors.Is(err, ErrDeadline), "%v %s", err, errb.String())
			} else {
				assert.NilError(t, err, errb.String())
				assert.Equal(t, res.ExitCode, 0, out.String()+errb.String())
			}
			return res
		}
	}
	both := func(name string, turn turnOf) diff.Summary {
		t.Helper()
		evd := turn(ev, false)
		assert.Equal(t, evd.WorktreeChanges.ScanAfter, "events", name)
		walked := turn(walk, true)
		assert.Equal(t, walked.WorktreeChanges.ScanAfter, "walk: asked for", name)
		// The one read from events took its scan before from the
		// namespace, the other walked: the reference, a full walk
		// before and after.
		// (Under runsc both keep the chown walks, whose hand-over walks.)
		if evd.Worktree != nil && evd.Worktree.Idmapped {
			assert.Assert(t, strings.HasPrefix(evd.WorktreeChanges.ScanBefore, "namespace"), name)
			assert.Equal(t, walked.WorktreeChanges.ScanBefore, "walk: asked for", name)
		} else {
			assert.Assert(t, strings.HasPrefix(evd.WorktreeChanges.ScanBefore, "walk: not idmapped"), name)
		}
		got, want := changed(t, evd), changed(t, walked)
		assert.DeepEqual(t, got, want)
		return got
	}

	s := both("battery", run(0, `set -e
cd /work
echo new > new.txt
mkdir -p n/a/b && echo d > n/a/b/d.txt
echo edited >> src/main.go
touch -r stamp.txt /tmp/stamp && printf 54321 > stamp.txt && touch -r /tmp/stamp stamp.txt
chmod 700 src/util/u.go
rm -rf gone
mv notes/old notes/moved && echo more >> notes/moved/deep/c.md
echo through-one-link >> linked.txt
ln src/main.go src/main-link.go
rm notes/a.md && ln -s ../AGENTS.md notes/a.md
echo upload > AGENTS.md
mkdir -p sub/.git && echo x > sub/.git/HEAD
`))
	// The control: the battery is in the report.
	assert.Assert(t, s.Added >= 10 && s.Modified >= 6 && s.Deleted >= 8, "%+v", s)
	var roots []string
	for _, c := range s.AgentConfig {
		roots = append(roots, c.Path)
	}
	assert.Equal(t, strings.Join(roots, " "), "AGENTS.md sub/.git")

	both("deadline", run(3*time.Second, `mkdir -p /work/dl/x && echo z > /work/dl/x/f && mv /work/src /work/src2 && echo up && sleep 600`))

	// The owner, between turns: none of it is the next turn's.
	for _, wt := range []string{ev, walk} {
		assert.NilError(t, os.WriteFile(filepath.Join(wt, "AGENTS.md"), []byte("owner\n"), 0o644))
		assert.NilError(t, os.WriteFile(filepath.Join(wt, "host.txt"), []byte("mine\n"), 0o644))
		assert.NilError(t, os.RemoveAll(filepath.Join(wt, "n")))
		assert.NilError(t, os.Rename(filepath.Join(wt, "notes"), filepath.Join(wt, "notes2")))
	}
	s = both("after the owner", run(0, `echo turn > /work/turn.txt`))
	assert.DeepEqual(t, []int{s.Added, s.Modified, s.Deleted}, []int{1, 0, 0})
}

// TestWorktreeChangesSeeMappedWrites: a turn that rewrites a worktree file
// through a shared mapping, and leaves the file in flight in a unix socket
// so that its last close (the only event such a write makes) comes only
// at some later unix garbage collection, has that file in its report read
// from events (diff.Watcher reads every file the turn opened again).
func TestWorktreeChangesSeeMappedWrites(t *testing.T) {
	e, runner := newHarness(t, "")
	base := t.TempDir()
	runner.Cfg.Worktree.Roots = []string{base}
	wt := filepath.Join(base, "wt")
	eventsTree(t, wt)
	bin := filepath.Join(wt, "mmapwrite")
	build := exec.Command("go", "build", "-o", bin, "./testdata/mmapwrite")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := build.CombinedOutput()
	assert.NilError(t, err, string(b))
	assert.NilError(t, os.Lchown(bin, 4242, 4242))
	// A coarse mtime tick apart from the tree's writes.
	time.Sleep(20 * time.Millisecond)
	task := taskid.Must(e.Task("mm"))
	for _, mode := range []string{"plain", "inflight"} {
		var out, errb bytes.Buffer
		res, err := runner.Run(context.Background(), Request{
			Task: task, Agent: "shell", Worktree: wt,
			Args:    []string{"-c", "/work/mmapwrite /work/stamp.txt " + mode},
			Streams: podman.Streams{Stdout: &out, Stderr: &errb},
		})
		assert.NilError(t, err, errb.String())
		assert.Equal(t, res.ExitCode, 0, out.String()+errb.String())
		// The control: the byte was written.
		data, err := os.ReadFile(filepath.Join(wt, "stamp.txt"))
		assert.NilError(t, err)
		assert.Equal(t, string(data[:1]), "Z", mode)
		assert.Equal(t, res.WorktreeChanges.ScanAfter, "events", mode)
		s := changed(t, res)
		assert.DeepEqual(t, []int{s.Added, s.Modified, s.Deleted}, []int{0, 1, 0})
		assert.NilError(t, os.WriteFile(filepath.Join(wt, "stamp.txt"), []byte("12345"), 0o644))
		time.Sleep(20 * time.Millisecond)
	}
}

// refusingEngine is the real podman client whose stop and removal of a
// cage fail while it is armed (the cage then really keeps running);
// beforeRefusal runs first, with the cage still running.
type refusingEngine struct {
	engine.Engine
	armed         atomic.Bool
	beforeRefusal func()
}

func (e *refusingEngine) Stop(ctx context.Context, id string, grace time.Duration) error {
	if e.armed.Load() {
		return errors.New("test: stop refused")
	}
	return e.Engine.Stop(ctx, id, grace)
}

func (e *refusingEngine) Remove(ctx context.Context, id string) error {
	if e.armed.Load() {
		e.beforeRefusal()
		return errors.New("test: removal refused")
	}
	return e.Engine.Remove(ctx, id)
}

// TestWorktreeChangesWalkedWhileTheCageMayRun: a turn past its deadline
// whose cage podman fails to stop and to remove still runs and writes the
// worktree after the turn ended: its events are not trusted, the report
// is the walk's (with that late write) and the give-back the full one,
// which gives the late file back too. The positive control: the same turn
// whose cage is removed reads its events.
func TestWorktreeChangesWalkedWhileTheCageMayRun(t *testing.T) {
	e, runner := newHarness(t, "")
	base := t.TempDir()
	runner.Cfg.Worktree.Roots = []string{base}
	wt := filepath.Join(base, "wt")
	eventsTree(t, wt)
	refusing := &refusingEngine{Engine: runner.Podman}
	runner.Podman = refusing
	task := taskid.Must(e.Task("mayrun"))
	turn := func(script string) (*Result, error) {
		var out, errb bytes.Buffer
		return runner.Run(context.Background(), Request{
			Task: task, Agent: "shell", Worktree: wt, Args: []string{"-c", script},
			Timeout: 3 * time.Second, Streams: podman.Streams{Stdout: &out, Stderr: &errb},
		})
	}

	res, err := turn(`echo one > /work/one.txt && echo up && sleep 600`)
	assert.Assert(t, errors.Is(err, ErrDeadline), "%v", err)
	assert.Assert(t, res.Removed, res.Error)
	assert.Equal(t, res.WorktreeChanges.ScanAfter, "events")
	assert.Equal(t, changed(t, res).Added, 1)

	// The cage writes late.txt only once its removal is under way: after
	// the turn's deadline, its stop (refused) and its last event.
	late := filepath.Join(wt, "late.txt")
	refusing.beforeRefusal = func() {
		assert.Check(t, os.WriteFile(filepath.Join(wt, "go"), nil, 0o644))
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if _, err := os.Lstat(late); err == nil {
				return
			}
		}
		t.Error("the cage did not write late.txt after its stop was refused")
	}
	refusing.armed.Store(true)
	res, err = turn(`echo two > /work/two.txt && echo up
while [ ! -e /work/go ]; do sleep 0.05; done
echo late > /work/late.txt
sleep 600`)
	refusing.armed.Store(false)
	assert.Assert(t, res.Cage != "")
	t.Cleanup(func() { _ = refusing.Remove(context.Background(), res.Cage) })
	assert.Assert(t, errors.Is(err, ErrDeadline), "%v", err)
	assert.Assert(t, !res.Removed)
	cage, cerr := refusing.CageNamed(context.Background(), res.Cage)
	assert.NilError(t, cerr)
	assert.Assert(t, cage != nil && cage.State == "running", "%+v", cage)
	assert.Equal(t, res.WorktreeChanges.ScanAfter, "walk: the cage may still run (not removed)")
	// two.txt, go and late.txt: the write after the turn's events is in it.
	assert.Equal(t, changed(t, res).Added, 3)
	assert.Assert(t, res.Worktree != nil, "no give-back: %s", res.Error)
	assert.Equal(t, uidOf(t, late), uint32(4242), "the full give-back did not reach the late write")
}
