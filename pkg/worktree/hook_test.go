package worktree

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/worktree/diff"
)

// The hand-over in the scan's walk (one walk before a turn, not two):
// ownership as handOver leaves it, and a snapshot equal to a scan taken
// after it — nothing reported changed.
func TestScanHookHandsOverAndSnapshotsTheResult(t *testing.T) {
	itest.Require(t, itest.Root)
	build := func() string {
		root := t.TempDir()
		write(t, root, "a.txt", "a")
		write(t, root, "dir/b.txt", "b")
		write(t, root, "dir/deeper/c.txt", "c")
		write(t, root, ".git/HEAD", "ref: refs/heads/main\n")
		write(t, root, "vendor/lib/.git/HEAD", "ref: refs/heads/main\n")
		write(t, root, "vendor/lib/x.go", "package x\n")
		write(t, root, "bare/HEAD", "ref: refs/heads/main\n")
		write(t, root, "bare/objects/o", "")
		write(t, root, "bare/refs/r", "")
		assert.NilError(t, os.Symlink("/etc/passwd", filepath.Join(root, "link")))
		assert.NilError(t, syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644))
		// Hard links: the chown through one link changes the other's ctime.
		assert.NilError(t, os.Link(filepath.Join(root, "a.txt"), filepath.Join(root, "dir/deeper/a-link.txt")))
		assert.NilError(t, os.Link(filepath.Join(root, "a.txt"), filepath.Join(root, "z-link.txt")))
		return root
	}
	const uid = 4242
	owners := func(root string) map[string]uint32 {
		m := map[string]uint32{}
		assert.NilError(t, filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			assert.NilError(t, err)
			var st syscall.Stat_t
			assert.NilError(t, syscall.Lstat(p, &st))
			rel, _ := filepath.Rel(root, p)
			m[rel] = st.Uid
			return nil
		}))
		return m
	}

	hooked := build()
	h, err := newHandOverHook(hooked, uid, uid)
	assert.NilError(t, err)
	snap, err := diff.ScanHook(context.Background(), hooked, h)
	assert.NilError(t, err)
	h.close()
	sum := diff.Diff(snap, scan(t, hooked))
	assert.DeepEqual(t, sum, diff.Summary{AgentConfig: []diff.Change{}, ScanMS: sum.ScanMS})

	walked := build()
	changed, err := handOver(walked, uid, uid)
	assert.NilError(t, err)
	assert.Assert(t, changed)
	got, want := owners(hooked), owners(walked)
	assert.DeepEqual(t, got, want)
	// And what that is: the task's, but for git metadata and the owner's
	// nested repositories.
	for rel, u := range got {
		switch rel {
		case ".git", ".git/HEAD", "vendor/lib/.git", "vendor/lib/.git/HEAD", "bare", "bare/HEAD", "bare/objects", "bare/objects/o", "bare/refs", "bare/refs/r":
			assert.Equal(t, u, uint32(0), rel)
		default:
			assert.Equal(t, u, uint32(uid), rel)
		}
	}

	// Root's already the task's: no hand-over, and Scan's snapshot.
	h, err = newHandOverHook(hooked, uid, uid)
	assert.NilError(t, err)
	assert.Assert(t, h == nil)
}

// The give-back in the scan's walk after a turn: ownership, kept nested
// repositories and the report as GiveBack leaves them, and a snapshot
// equal to a scan taken before it (what the turn left).
func TestScanThenHookGivesBackAsGiveBack(t *testing.T) {
	itest.Require(t, itest.Root)
	const lo, hi, task = 300000, 365536, 301000
	build := func() string {
		root := t.TempDir()
		write(t, root, "a.txt", "a")
		write(t, root, "dir/b.txt", "b")
		write(t, root, ".git/HEAD", "ref: refs/heads/main\n")
		write(t, root, "owners/lib/.git/HEAD", "ref: refs/heads/main\n")
		// Hard links: the chown through one link changes the other's ctime.
		assert.NilError(t, os.Link(filepath.Join(root, "a.txt"), filepath.Join(root, "dir/a-link.txt")))
		assert.NilError(t, os.Link(filepath.Join(root, "a.txt"), filepath.Join(root, "z-link.txt")))
		changed, err := handOver(root, task, task)
		assert.NilError(t, err)
		assert.Assert(t, changed)
		// What the turn made, as the task's user.
		write(t, root, "dir/new.txt", "n")
		write(t, root, "planted/.git/hooks/pre-commit", "evil")
		write(t, root, "bare/HEAD", "ref: refs/heads/main\n")
		write(t, root, "bare/objects/o", "")
		write(t, root, "bare/refs/r", "")
		assert.NilError(t, os.Symlink("/etc/shadow", filepath.Join(root, "dir/link")))
		for _, p := range []string{"dir/new.txt", "planted", "planted/.git", "planted/.git/hooks", "planted/.git/hooks/pre-commit", "bare", "bare/HEAD", "bare/objects", "bare/objects/o", "bare/refs", "bare/refs/r"} {
			assert.NilError(t, os.Chown(filepath.Join(root, p), task, task))
			assert.NilError(t, os.Chmod(filepath.Join(root, p), 0o755))
		}
		assert.NilError(t, os.Lchown(filepath.Join(root, "dir/link"), task, task))
		return root
	}
	state := func(root string) map[string][2]uint32 {
		m := map[string][2]uint32{}
		assert.NilError(t, filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			assert.NilError(t, err)
			var st syscall.Stat_t
			assert.NilError(t, syscall.Lstat(p, &st))
			rel, _ := filepath.Rel(root, p)
			m[rel] = [2]uint32{st.Uid, st.Mode}
			return nil
		}))
		return m
	}

	hooked := build()
	left := scan(t, hooked)
	h, err := newGiveBackHook(hooked, 4242, 4242, lo, hi)
	assert.NilError(t, err)
	snap, err := diff.ScanThenHook(context.Background(), hooked, h)
	assert.NilError(t, err)
	rep, err := h.Finish()
	assert.NilError(t, err)
	sum := diff.Diff(left, snap)
	assert.DeepEqual(t, sum, diff.Summary{AgentConfig: []diff.Change{}, ScanMS: sum.ScanMS})

	walked := build()
	want, err := giveBack(walked, 4242, 4242, lo, hi)
	assert.NilError(t, err)
	assert.DeepEqual(t, state(hooked), state(walked))
	assert.DeepEqual(t, rep, want)
	assert.DeepEqual(t, rep.KeptPaths, []string{"bare", "planted/.git"})
	for rel, s := range state(hooked) {
		switch {
		case rel == "bare" || rel == "planted/.git" || filepath.Dir(rel) == "bare" || filepath.Dir(filepath.Dir(rel)) == "bare" || len(rel) > len("planted/.git/") && rel[:len("planted/.git/")] == "planted/.git/":
			assert.Equal(t, s[0], uint32(task), rel) // kept with the task's uid
		default:
			assert.Assert(t, s[0] < lo || s[0] >= hi, "%s still the task's", rel)
		}
	}
}

// BenchmarkWalksAroundATurn100k: the walks around a turn of a 100 000-file
// worktree (1 000 directories of 100 files), as separate walks (hand-over,
// scan before; scan after, give-back) and as the merged ones (ScanHook,
// ScanThenHook), alternating in one run.
func BenchmarkWalksAroundATurn100k(b *testing.B) {
	itest.Require(b, itest.Root)
	const lo, hi, task, owner = 300000, 365536, 301000, 4242
	root := b.TempDir()
	for d := 0; d < 1000; d++ {
		for f := 0; f < 100; f++ {
			if f == 0 { // makes the directory
				write(b, root, fmt.Sprintf("d%03d/f%02d", d, f), "")
				continue
			}
			assert.NilError(b, os.WriteFile(filepath.Join(root, fmt.Sprintf("d%03d/f%02d", d, f)), nil, 0o644))
		}
	}
	assert.NilError(b, os.Chown(root, owner, owner))
	ctx := context.Background()
	var separate, merged time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		_, err := handOver(root, task, task)
		assert.NilError(b, err)
		_, err = diff.Scan(ctx, root)
		assert.NilError(b, err)
		_, err = diff.Scan(ctx, root)
		assert.NilError(b, err)
		_, err = giveBack(root, owner, owner, lo, hi)
		assert.NilError(b, err)
		separate += time.Since(start)

		start = time.Now()
		h, err := newHandOverHook(root, task, task)
		assert.NilError(b, err)
		_, err = diff.ScanHook(ctx, root, h)
		assert.NilError(b, err)
		h.close()
		g, err := newGiveBackHook(root, owner, owner, lo, hi)
		assert.NilError(b, err)
		_, err = diff.ScanThenHook(ctx, root, g)
		assert.NilError(b, err)
		rep, err := g.Finish()
		assert.NilError(b, err)
		assert.Equal(b, rep.Changed, 101001)
		merged += time.Since(start)
	}
	b.ReportMetric(float64(separate.Milliseconds())/float64(b.N), "separate-ms")
	b.ReportMetric(float64(merged.Milliseconds())/float64(b.N), "merged-ms")
	b.ReportMetric(float64(merged)/float64(separate), "ratio")
	b.ReportMetric(0, "ns/op")
}

func write(t testing.TB, root, rel, data string) {
	t.Helper()
	p := filepath.Join(root, rel)
	assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	assert.NilError(t, os.WriteFile(p, []byte(data), 0o644))
}

func scan(t testing.TB, root string) *diff.Snapshot {
	t.Helper()
	s, err := diff.Scan(context.Background(), root)
	assert.NilError(t, err)
	return s
}
