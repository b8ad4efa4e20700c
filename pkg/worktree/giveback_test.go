package worktree

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

func owner(t *testing.T, p string) (uint32, uint32) {
	t.Helper()
	fi, err := os.Lstat(p)
	assert.NilError(t, err)
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid
}

// TestGiveBack: entries in the task's uid range go back to the owner; others
// keep theirs; links are changed themselves, never their targets; FIFOs are
// never opened; another filesystem inside is left alone.
func TestGiveBack(t *testing.T) {
	itest.Require(t, itest.Root) // chown needs root
	const lo, hi = 200000, 265536
	dir := t.TempDir()
	wt := filepath.Join(dir, "wt")
	outside := filepath.Join(dir, "outside")
	for _, d := range []string{wt, filepath.Join(wt, "a"), filepath.Join(wt, "a", "b"), outside} {
		assert.NilError(t, os.Mkdir(d, 0o755))
	}
	files := []string{filepath.Join(wt, "f"), filepath.Join(wt, "a", "g"), filepath.Join(wt, "a", "b", "h"), filepath.Join(outside, "secret")}
	for _, f := range files {
		assert.NilError(t, os.WriteFile(f, nil, 0o644))
	}
	assert.NilError(t, os.Symlink(outside, filepath.Join(wt, "a", "out")))
	assert.NilError(t, syscall.Mkfifo(filepath.Join(wt, "a", "fifo"), 0o600))
	foreign := filepath.Join(wt, "foreign")
	assert.NilError(t, os.WriteFile(foreign, nil, 0o644))
	suid := filepath.Join(wt, "suid")
	assert.NilError(t, os.WriteFile(suid, nil, 0o755))
	// Everything in the task's range, as a turn leaves it; "foreign" is
	// another user's, outside the range; the link's target too.
	for _, p := range append(files, wt, filepath.Join(wt, "a"), filepath.Join(wt, "a", "b"), filepath.Join(wt, "a", "out"), filepath.Join(wt, "a", "fifo"), outside, suid) {
		assert.NilError(t, os.Lchown(p, lo+1000, lo+1000))
	}
	assert.NilError(t, os.Chmod(suid, 0o4755))
	assert.NilError(t, os.Lchown(foreign, 5555, 5555))

	done := make(chan struct{})
	var rep GiveBackReport
	var err error
	go func() { rep, err = giveBack(wt, 4242, 4343, lo, hi); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("GiveBack blocked (opened the FIFO?)")
	}
	assert.NilError(t, err)
	for _, p := range []string{wt, filepath.Join(wt, "a"), filepath.Join(wt, "a", "b"), filepath.Join(wt, "f"), filepath.Join(wt, "a", "g"), filepath.Join(wt, "a", "b", "h"), filepath.Join(wt, "a", "out"), filepath.Join(wt, "a", "fifo"), suid} {
		u, g := owner(t, p)
		assert.Equal(t, u, uint32(4242), p)
		assert.Equal(t, g, uint32(4343), p)
	}
	assert.Equal(t, rep.Changed, 9)
	u, _ := owner(t, foreign)
	assert.Equal(t, u, uint32(5555), "outside the task's range: left alone")
	u, _ = owner(t, outside)
	assert.Equal(t, u, uint32(lo+1000), "the link's target directory was not followed")
	u, _ = owner(t, filepath.Join(outside, "secret"))
	assert.Equal(t, u, uint32(lo+1000), "nothing beyond the link was changed")
	fi, err := os.Lstat(suid)
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode()&os.ModeSetuid, os.FileMode(0), "setuid cleared by the chown")

	// Idempotent: nothing is in the range any more.
	rep, err = giveBack(wt, 4242, 4343, lo, hi)
	assert.NilError(t, err)
	assert.Equal(t, rep.Changed, 0)
}

// TestGiveBackLeavesOtherFilesystems: a tmpfs mounted inside the worktree
// is another filesystem; its entries keep their owner.
func TestGiveBackLeavesOtherFilesystems(t *testing.T) {
	itest.Require(t, itest.Root)
	const lo, hi = 200000, 265536
	wt := t.TempDir()
	mnt := filepath.Join(wt, "mnt")
	assert.NilError(t, os.Mkdir(mnt, 0o755))
	assert.NilError(t, syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"))
	t.Cleanup(func() { _ = syscall.Unmount(mnt, syscall.MNT_DETACH) })
	f := filepath.Join(mnt, "x")
	assert.NilError(t, os.WriteFile(f, nil, 0o644))
	assert.NilError(t, os.Lchown(f, lo+1, lo+1))
	g := filepath.Join(wt, "y")
	assert.NilError(t, os.WriteFile(g, nil, 0o644))
	assert.NilError(t, os.Lchown(g, lo+1, lo+1))
	_, err := giveBack(wt, 4242, 4242, lo, hi)
	assert.NilError(t, err)
	u, _ := owner(t, f)
	assert.Equal(t, u, uint32(lo+1), "another filesystem inside is not walked")
	u, _ = owner(t, g)
	assert.Equal(t, u, uint32(4242), "positive control")
}

// BenchmarkOwnershipGiveBack gives back a 100 000-file worktree (1 000
// directories of 100 files) owned by the task's range.
func BenchmarkOwnershipGiveBack(b *testing.B) {
	itest.Require(b, itest.Root)
	const lo, hi = 200000, 265536
	wt := b.TempDir()
	for d := 0; d < 1000; d++ {
		sub := filepath.Join(wt, fmt.Sprintf("d%04d", d))
		if err := os.Mkdir(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := 0; f < 100; f++ {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%03d", f)), nil, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if _, err := handOver(wt, lo+1000, lo+1000); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		rep, err := giveBack(wt, 4242, 4242, lo, hi)
		if err != nil {
			b.Fatal(err)
		}
		if rep.Changed != 101001 {
			b.Fatalf("changed %d entries, want 101001", rep.Changed)
		}
	}
}
