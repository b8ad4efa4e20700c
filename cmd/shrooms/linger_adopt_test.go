package main

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/teardownd"
)

// TestWorkerAdoptChecksTheFiles: the worker takes a handed job's task lock
// only when the three files are that task's own lock file, directory and
// teardown.log (by device and inode) and the lock is the sender's or
// free: another task's file in any place, or a lock held by another open
// file (a turn that runs), is refused. The positive control: the task's
// own files are adopted, the lock then held by the worker's description.
func TestWorkerAdoptChecksTheFiles(t *testing.T) {
	state := t.TempDir()
	layout := taskstate.Layout{Dir: state}
	w := &worker{layout: layout}
	open := func(task, name string) *os.File {
		id := taskid.Must(task)
		assert.NilError(t, os.MkdirAll(layout.Task(id), 0o700))
		p := layout.Task(id)
		if name != "." {
			p = layout.TaskFile(id, name)
			f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
			assert.NilError(t, err)
			t.Cleanup(func() { f.Close() })
			return f
		}
		f, err := os.Open(p)
		assert.NilError(t, err)
		t.Cleanup(func() { f.Close() })
		return f
	}
	files := func(task string) [3]*os.File {
		return [3]*os.File{open(task, "lock"), open(task, "."), open(task, "teardown.log")}
	}
	job := teardownd.Job{Task: "review-a", Agent: "shell"}
	for i := 0; i < 3; i++ {
		fs, other := files("review-a"), files("review-b")
		fs[i] = other[i]
		_, err := w.adopt(job, fs[0], fs[1], fs[2])
		assert.Assert(t, is.ErrorContains(err, "is another"), "file %d of another task", i)
	}
	// A lock file named right but held by another description: refused.
	held := files("review-a")
	assert.NilError(t, unix.Flock(int(open("review-a", "lock").Fd()), unix.LOCK_EX|unix.LOCK_NB))
	_, err := w.adopt(job, held[0], held[1], held[2])
	assert.Assert(t, err != nil, "adopted a lock another holds")

	// Positive control: task c's own files.
	own := files("review-c")
	lock, err := w.adopt(teardownd.Job{Task: "review-c"}, own[0], own[1], own[2])
	assert.NilError(t, err)
	probe, err := os.OpenFile(filepath.Join(layout.Task(taskid.Must("review-c")), "lock"), os.O_RDWR, 0)
	assert.NilError(t, err)
	defer probe.Close()
	assert.Assert(t, unix.Flock(int(probe.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil, "the adopted lock is not held")
	lock.Release()
}
