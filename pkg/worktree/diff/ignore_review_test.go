package diff

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// TestWatcherIgnoredDirectoryBackThenMapped: a worktree directory moved
// out during the turn, busy there until the reader puts an ignore mark on
// it (the kernel then drops the opens in it), moved back, and a file in it
// written through a shared mapping (its only event an open, which the mark
// drops): After still equals a full walk and reports the write, because
// the move back is an event in the worktree whose subtree After walks
// whole. The controls: the mark was put on it, and the mapping wrote.
func TestWatcherIgnoredDirectoryBackThenMapped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("fanotify's filesystem mark needs root")
	}
	root := tree(t)
	outside := t.TempDir() // the same filesystem
	time.Sleep(20 * time.Millisecond)
	w, before := watched(t, root)
	out := filepath.Join(outside, "d1")
	must(t, os.Rename(filepath.Join(root, "d1"), out))
	deadline := time.Now().Add(5 * time.Second)
	for {
		write(t, outside, "d1/busy.txt", "x")
		_, err := os.ReadFile(filepath.Join(out, "top.txt"))
		must(t, err)
		w.mu.Lock()
		n := w.nIgnored
		w.mu.Unlock()
		if n >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("d1 was never ignored")
		}
		time.Sleep(10 * time.Millisecond)
	}
	must(t, os.Remove(filepath.Join(out, "busy.txt")))
	must(t, os.Rename(out, filepath.Join(root, "d1")))
	time.Sleep(20 * time.Millisecond) // a coarse mtime tick apart
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), mmapWriterEnv+"="+filepath.Join(root, "d1", "top.txt"))
	b, err := cmd.CombinedOutput()
	assert.NilError(t, err, string(b))
	data, err := os.ReadFile(filepath.Join(root, "d1", "top.txt"))
	must(t, err)
	assert.Equal(t, string(data[:1]), "Z") // the control: it wrote
	s := sameAsScan(t, root, w, before)
	assert.Assert(t, s.Modified >= 1, "%+v", s)
	got := Diff(before, scan(t, root))
	assert.Equal(t, s.Modified, got.Modified)
}

// TestWatcherForgottenDirectoryMovedIn: directories placed outside,
// forgotten at maxPlaces, then moved into the worktree and changed there
// (a file written, one made, a mode changed): After equals a full walk.
// The control: the bound was reached and they were forgotten.
func TestWatcherForgottenDirectoryMovedIn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("fanotify's filesystem mark needs root")
	}
	root := tree(t)
	outside := t.TempDir()
	w, before := watched(t, root)
	w.mu.Lock()
	w.maxPlaces = 50
	w.mu.Unlock()
	for d := range 300 {
		write(t, outside, fmt.Sprintf("o%03d/f", d), "x")
		if d%50 == 0 {
			time.Sleep(60 * time.Millisecond) // several reads: some ignored too
		}
	}
	time.Sleep(100 * time.Millisecond)
	w.mu.Lock()
	forgets := w.nForgets
	w.mu.Unlock()
	assert.Assert(t, forgets > 0, "the control: the bound was reached")
	for _, d := range []string{"o000", "o150", "o299"} {
		must(t, os.Rename(filepath.Join(outside, d), filepath.Join(root, d)))
		write(t, root, d+"/f", "changed in the worktree")
		write(t, root, d+"/new", "new")
		must(t, os.Chmod(filepath.Join(root, d), 0o700))
	}
	s := sameAsScan(t, root, w, before)
	assert.Equal(t, s.Added, 9)
}
