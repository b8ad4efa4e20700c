package diff

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
)

// busyWriterEnv asks this test binary (TestMain) to be busyWrite's child:
// the rest of the filesystem, busy while a turn runs.
const busyWriterEnv = "SHROOMS_DIFF_BUSY_WRITE"

// The filesystem's other users: busyDirs directories of busyFiles files.
const (
	busyDirs  = 1000
	busyFiles = 10
)

// busyWriteMain is the child's side: "out rate seconds files|dirs" in
// busyWriterEnv.
func busyWriteMain(arg string) error {
	f := strings.Fields(arg)
	if len(f) != 4 {
		return fmt.Errorf("busy writer: want \"out rate seconds files|dirs\", got %q", arg)
	}
	rate, err := strconv.Atoi(f[1])
	if err != nil {
		return fmt.Errorf("busy writer rate: %w", err)
	}
	secs, err := strconv.ParseFloat(f[2], 64)
	if err != nil {
		return fmt.Errorf("busy writer duration: %w", err)
	}
	n, err := busyWrite(f[0], rate, time.Duration(secs*float64(time.Second)), f[3] == "dirs")
	if err != nil {
		return err
	}
	fmt.Println(n)
	return nil
}

// busyWrite works on out's directories for dur at rate operations a
// second (flat out when it cannot keep up), round robin over them: an
// even operation creates, writes, closes and unlinks a file, an odd one
// opens, reads and closes an existing one. With newDirs every operation
// makes a new directory, a file in it, and removes both. It returns the
// operations done.
func busyWrite(out string, rate int, dur time.Duration, newDirs bool) (int, error) {
	dirs := make([]string, busyDirs)
	for d := range dirs {
		dirs[d] = fmt.Sprintf("%s/o%04d/", out, d)
	}
	buf := make([]byte, 64)
	start := time.Now()
	n := 0
	for {
		el := time.Since(start)
		if el >= dur {
			return n, nil
		}
		if rate == 0 {
			time.Sleep(dur - el)
			continue
		}
		target := int(float64(rate) * el.Seconds())
		for i := 0; n < target && i < 256; i++ {
			dir := dirs[(n/2)%busyDirs]
			if newDirs {
				if err := busyNewDir(dir+"n"+strconv.Itoa(n), buf); err != nil {
					return n, err
				}
			} else if n%2 == 0 {
				p := dir + "t" + strconv.Itoa(n)
				fd, err := unix.Open(p, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
				if err != nil {
					return n, fmt.Errorf("busy writer: %w", err)
				}
				_, err = unix.Write(fd, buf)
				unix.Close(fd)
				if err != nil {
					return n, fmt.Errorf("busy writer: %w", err)
				}
				if err := unix.Unlink(p); err != nil {
					return n, fmt.Errorf("busy writer: %w", err)
				}
			} else {
				fd, err := unix.Open(dir+"f"+strconv.Itoa(n%busyFiles), unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if err != nil {
					return n, fmt.Errorf("busy writer: %w", err)
				}
				_, _ = unix.Read(fd, buf)
				unix.Close(fd)
			}
			n++
		}
		if n >= target {
			time.Sleep(time.Millisecond)
		}
	}
}

// busyNewDir makes dir, a file in it, and removes both.
func busyNewDir(dir string, buf []byte) error {
	if err := unix.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("busy writer: %w", err)
	}
	p := dir + "/f"
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("busy writer: %w", err)
	}
	_, err = unix.Write(fd, buf)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("busy writer: %w", err)
	}
	if err := unix.Unlink(p); err != nil {
		return fmt.Errorf("busy writer: %w", err)
	}
	if err := unix.Rmdir(dir); err != nil {
		return fmt.Errorf("busy writer: %w", err)
	}
	return nil
}

// busyLoad is what the rest of the filesystem does: rate operations a
// second on files, or making and removing directories (newDirs).
type busyLoad struct {
	rate    int
	newDirs bool
}

func (l busyLoad) String() string {
	if l.newDirs {
		return fmt.Sprintf("%dd", l.rate)
	}
	return fmt.Sprint(l.rate)
}

// busyFilesystem is a fresh ext4 filesystem (a loop-mounted image, the
// kind of filesystem a worktree lies on here) under /run, unmounted and
// removed at the end: the watch's filesystem mark sees only the test's
// own work there.
func busyFilesystem(b testing.TB) string {
	img := filepath.Join(b.TempDir(), "busy.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.Truncate(img, 512<<20); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-N", "131072", img).CombinedOutput(); err != nil {
		b.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	mnt := fmt.Sprintf("/run/shrooms-bench-fanwatch-%d-%d", os.Getpid(), time.Now().UnixNano())
	if err := os.Mkdir(mnt, 0o700); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		os.Remove(mnt)
		b.Fatalf("mount %s: %v: %s", img, err, out)
	}
	b.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			b.Errorf("unmount %s: %v", mnt, err)
			return
		}
		os.Remove(mnt)
	})
	return mnt
}

// busyTurn is one turn's figures at one rate of the rest of the
// filesystem: with no watch (off) and with it (on).
type busyTurn struct {
	cpuOff, cpuOn     time.Duration // this process's CPU over the turn
	wallOff, wallOn   time.Duration // the turn's length
	after             time.Duration // After's latency (on)
	reader            time.Duration // the reader's own thread's CPU (on)
	events, outside   int           // events read, of them dropped (on)
	places, ignored   int           // directory handles placed, and of them ignored in the kernel (on)
	kept              int           // handles of files changed outside kept for afterNamespace (on)
	fellBack          string        // why After fell back ("" it did not)
	opsOff, opsOn     int           // the writer's operations
	wCPUOff, wCPUOn   time.Duration // the writer's CPU (its events are made in its syscalls)
	wWallOff, wWallOn time.Duration
}

func cpuSelf() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// busyRun runs the writer at rate for dur, changing the turn's 99 files
// in the worktree halfway, and returns the writer's operations, CPU and
// wall time.
func busyRun(b *testing.B, out, root string, load busyLoad, dur time.Duration, round int) (int, time.Duration, time.Duration) {
	mode := "files"
	if load.newDirs {
		mode = "dirs"
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %g %s", busyWriterEnv, out, load.rate, dur.Seconds(), mode))
	cmd.Stderr = os.Stderr
	var stdout strings.Builder
	cmd.Stdout = &stdout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	time.Sleep(dur / 2)
	for f := range 99 {
		p := filepath.Join(root, "d000", fmt.Sprintf("f%02d", f))
		if err := os.WriteFile(p, []byte(fmt.Sprint("round ", round)), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	if err := cmd.Wait(); err != nil {
		b.Fatalf("busy writer: %v", err)
	}
	wall := time.Since(start)
	n, err := strconv.Atoi(strings.TrimSpace(stdout.String()))
	if err != nil {
		b.Fatalf("busy writer's count %q: %v", stdout.String(), err)
	}
	return n, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), wall
}

// BenchmarkWatchBusyFilesystem: what the worktree's watch costs when the
// rest of its filesystem is busy. On a fresh ext4 filesystem, a worktree
// of 10 000 files (100 directories of 100) and, outside it, 1 000
// directories of 10 files that a child process works on for a second at
// 0, 1 000, 10 000 and 50 000 operations a second (create, write, close
// and unlink a file; open, read and close an existing one), and at 5 000
// a second making a new directory, a file in it, and removing both
// ("5000d"); halfway the "turn" changes 99 files of the worktree. Each
// round runs every rate twice, with no watch and with one (Watch, the
// scan before, After), interleaved. Reported per rate (medians): this
// process's CPU per second of turn with and without the watch, the
// reader's own thread's, After's latency, the events read and dropped as
// outside, directory handles placed, how many rounds fell back, and the
// writer's CPU per operation with and without the mark.
func BenchmarkWatchBusyFilesystem(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Fatal("fanotify's filesystem mark and the loop mount need root")
	}
	mnt := busyFilesystem(b)
	root, out := filepath.Join(mnt, "wt"), filepath.Join(mnt, "out")
	for d := range 100 {
		for f := range 100 {
			write(b, root, fmt.Sprintf("d%03d/f%02d", d, f), "x\n")
		}
	}
	for d := range busyDirs {
		for f := range busyFiles {
			write(b, out, fmt.Sprintf("o%04d/f%d", d, f), "y\n")
		}
	}
	ctx := context.Background()
	const dur = time.Second
	rates := []busyLoad{{0, false}, {1_000, false}, {10_000, false}, {50_000, false}, {5_000, true}}
	turns := make([][]busyTurn, len(rates))
	b.ResetTimer()
	for i := range b.N {
		for ri, rate := range rates {
			var t busyTurn
			// Off: the same turn, no watch.
			if _, err := Scan(ctx, root); err != nil {
				b.Fatal(err)
			}
			c0, w0 := cpuSelf(), time.Now()
			t.opsOff, t.wCPUOff, t.wWallOff = busyRun(b, out, root, rate, dur, 2*i)
			t.cpuOff, t.wallOff = cpuSelf()-c0, time.Since(w0)
			// On: the watch from before the scan before to After.
			w, err := Watch(root)
			if err != nil {
				b.Fatal(err)
			}
			before, err := Scan(ctx, root)
			if err != nil {
				b.Fatal(err)
			}
			c0, w0 = cpuSelf(), time.Now()
			t.opsOn, t.wCPUOn, t.wWallOn = busyRun(b, out, root, rate, dur, 2*i+1)
			a0 := time.Now()
			got, why := w.After(ctx, before)
			t.after = time.Since(a0)
			t.cpuOn, t.wallOn = cpuSelf()-c0, time.Since(w0)
			w.mu.Lock()
			t.events, t.outside, t.places, t.ignored, t.reader = w.nEvents, w.nOutside, len(w.places), w.nIgnored, w.readerCPU
			t.kept = len(w.outside)
			w.mu.Unlock()
			w.Close()
			t.fellBack = why
			if got != nil {
				want, err := Scan(ctx, root)
				if err != nil {
					b.Fatal(err)
				}
				if s := Diff(before, got); s.Modified != 99 || !maps.Equal(got.entries, want.entries) {
					b.Fatalf("at %v ops/s the events' snapshot differs from the walk's: %+v", rate, s)
				}
			}
			turns[ri] = append(turns[ri], t)
		}
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	med := func(ts []busyTurn, f func(busyTurn) float64) float64 {
		v := make([]float64, len(ts))
		for i, t := range ts {
			v[i] = f(t)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	b.Logf("%8s %8s %8s %8s %8s %7s %8s %8s %7s %7s %5s %9s %9s %7s %7s",
		"ops/s", "cpu off", "cpu on", "watch", "reader", "after", "events", "dropped", "placed", "kept", "fell", "writer/s", "writer/s", "µs/op", "µs/op")
	b.Logf("%8s %8s %8s %8s %8s %7s %8s %8s %7s %7s %5s %9s %9s %7s %7s",
		"asked", "ms/s", "ms/s", "ms/s", "ms/s", "ms", "", "", "", "outside", "back", "off", "on", "off", "on")
	for ri, rate := range rates {
		ts := turns[ri]
		off := med(ts, func(t busyTurn) float64 { return ms(t.cpuOff) / t.wallOff.Seconds() })
		on := med(ts, func(t busyTurn) float64 { return ms(t.cpuOn) / t.wallOn.Seconds() })
		watch := med(ts, func(t busyTurn) float64 {
			return ms(t.cpuOn)/t.wallOn.Seconds() - ms(t.cpuOff)/t.wallOff.Seconds()
		})
		reader := med(ts, func(t busyTurn) float64 { return ms(t.reader) / t.wallOn.Seconds() })
		after := med(ts, func(t busyTurn) float64 { return ms(t.after) })
		events := med(ts, func(t busyTurn) float64 { return float64(t.events) })
		outside := med(ts, func(t busyTurn) float64 { return float64(t.outside) })
		places := med(ts, func(t busyTurn) float64 { return float64(t.places) })
		kept := med(ts, func(t busyTurn) float64 { return float64(t.kept) })
		fell := 0
		for _, t := range ts {
			if t.fellBack != "" {
				fell++
				b.Logf("at %v ops/s After fell back: %s", rate, t.fellBack)
			}
		}
		rateOff := med(ts, func(t busyTurn) float64 { return float64(t.opsOff) / t.wWallOff.Seconds() })
		rateOn := med(ts, func(t busyTurn) float64 { return float64(t.opsOn) / t.wWallOn.Seconds() })
		perOp := func(cpu time.Duration, n int) float64 {
			if n == 0 {
				return 0
			}
			return float64(cpu) / float64(time.Microsecond) / float64(n)
		}
		usOff := med(ts, func(t busyTurn) float64 { return perOp(t.wCPUOff, t.opsOff) })
		usOn := med(ts, func(t busyTurn) float64 { return perOp(t.wCPUOn, t.opsOn) })
		b.Logf("%8v %8.1f %8.1f %8.1f %8.1f %7.2f %8.0f %8.0f %7.0f %7.0f %5d %9.0f %9.0f %7.2f %7.2f",
			rate, off, on, watch, reader, after, events, outside, places, kept, fell, rateOff, rateOn, usOff, usOn)
		k := fmt.Sprintf("r%v:", rate)
		b.ReportMetric(watch, k+"watch-cpu-ms/s")
		b.ReportMetric(reader, k+"reader-cpu-ms/s")
		b.ReportMetric(after, k+"after-ms")
		b.ReportMetric(events, k+"events")
		b.ReportMetric(float64(fell), k+"fell-back")
	}
	b.ReportMetric(0, "ns/op")
}

// The rest of the filesystem busy while a turn runs: the watcher reads its
// events in batches and drops them, and still sees every change of the
// turn (the control: the report equals the full walk's, with the turn's
// changes in it).
func TestWatcherDropsTheBusyRestOfTheFilesystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("fanotify's filesystem mark and the loop mount need root")
	}
	mnt := busyFilesystem(t)
	root, out := filepath.Join(mnt, "wt"), filepath.Join(mnt, "out")
	write(t, root, "keep.txt", "keep")
	for f := range 20 {
		write(t, root, fmt.Sprintf("d/f%02d", f), "x")
	}
	for d := range busyDirs {
		for f := range busyFiles {
			write(t, out, fmt.Sprintf("o%04d/f%d", d, f), "y")
		}
	}
	w, before := watched(t, root)
	done := make(chan error, 1)
	go func() {
		_, err := busyWrite(out, 20_000, 600*time.Millisecond, false)
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	for f := range 10 {
		write(t, root, fmt.Sprintf("d/f%02d", f), "changed")
	}
	write(t, root, "d/new/added.txt", "added")
	must(t, os.Remove(filepath.Join(root, "keep.txt")))
	must(t, <-done)
	s := sameAsScan(t, root, w, before)
	assert.Equal(t, s.Modified, 10)
	assert.Equal(t, s.Added, 2)
	assert.Equal(t, s.Deleted, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("%d events in %d reads, %d dropped as outside, %d directories placed, %d ignored, %d kept",
		w.nEvents, w.nReads, w.nOutside, len(w.places), w.nIgnored, len(w.dirty))
	// The writer's events were seen (the control: each directory's first
	// placed it outside) and the kernel dropped the rest.
	assert.Assert(t, w.nIgnored >= busyDirs, "%d directories ignored", w.nIgnored)
	// Kept: the turn's entries and their directories, none of the writer's.
	for dn := range w.dirty {
		pl, why := w.place(dn.handle)
		assert.Equal(t, why, "")
		assert.Assert(t, pl.in, "an event outside the worktree was kept: %q", dn.name)
	}
	// Gathered: one read takes many events (each read as it came was a
	// poll and a read per event).
	assert.Assert(t, w.nReads*10 < w.nEvents, "%d reads for %d events", w.nReads, w.nEvents)
}

// Stop wakes a reader waiting for events on an idle filesystem (it waits
// with no timeout), and the change made just before is in the report.
func TestWatcherStopWakesAnIdleReader(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("fanotify's filesystem mark and the loop mount need root")
	}
	root := filepath.Join(busyFilesystem(t), "wt")
	write(t, root, "a.txt", "a")
	w, before := watched(t, root)
	time.Sleep(100 * time.Millisecond) // the reader is waiting in poll
	write(t, root, "a.txt", "changed")
	time.Sleep(100 * time.Millisecond) // read, and waiting again
	stopped := make(chan struct{})
	go func() {
		w.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		// An event ends the wait, so that the failure is not a hang.
		write(t, root, "wake.txt", "wake")
		<-stopped
		t.Fatal("Stop did not end the reader's wait")
	}
	s := sameAsScan(t, root, w, before)
	assert.Equal(t, s.Modified, 1)
}

// Directories placed outside, whose events the kernel then drops, that
// come into the worktree and change there: After walks them whole (their
// move is an event in the worktree, or in a directory that came in so).
func TestWatcherIgnoredDirectoriesComingIn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("fanotify's filesystem mark needs root")
	}
	root := tree(t)
	outside := t.TempDir()
	w, before := watched(t, root)
	// Each of them placed outside and, busy a read later, ignored.
	deadline := time.Now().Add(5 * time.Second)
	for {
		write(t, outside, "a/x.txt", "x")
		write(t, outside, "a/sub/y.txt", "y")
		write(t, outside, "b/z.txt", "z")
		w.mu.Lock()
		n := w.nIgnored
		w.mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d directories ignored, want a, a/sub and b", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// b into a (both ignored), then a into the worktree; then changes in
	// all three, now inside.
	p := func(rel string) string { return filepath.Join(root, rel) }
	must(t, os.Rename(filepath.Join(outside, "b"), filepath.Join(outside, "a", "b")))
	must(t, os.Rename(filepath.Join(outside, "a"), p("came")))
	write(t, root, "came/x.txt", "changed")
	write(t, root, "came/sub/y.txt", "changed")
	write(t, root, "came/b/z.txt", "changed")
	write(t, root, "came/b/new.txt", "new")
	must(t, os.Chmod(p("came/sub"), 0o700))
	// And one moved out again after changes inside.
	must(t, os.Rename(p("came/b"), filepath.Join(outside, "b-out")))
	s := sameAsScan(t, root, w, before)
	assert.Equal(t, s.Added, 4) // came, came/x.txt, came/sub, came/sub/y.txt
}

// Past maxPlaces the directories placed outside are forgotten, not a
// doubt: a host that makes directories all the time no longer makes a
// long turn fall back. The worktree's own directories past it still do.
func TestWatcherForgetsDirectoriesOutside(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("fanotify's filesystem mark needs root")
	}
	root := tree(t)
	outside := t.TempDir() // the same filesystem
	w, before := watched(t, root)
	w.mu.Lock()
	w.maxPlaces = 50
	w.mu.Unlock()
	for d := range 300 {
		write(t, outside, fmt.Sprintf("o%03d/f", d), "x")
	}
	write(t, root, "d0/top.txt", "changed")
	write(t, root, "n/a/b.txt", "new")
	s := sameAsScan(t, root, w, before)
	assert.Equal(t, s.Modified, 1)
	assert.Equal(t, s.Added, 3)
	w.mu.Lock()
	forgets, places := w.nForgets, len(w.places)
	w.mu.Unlock()
	t.Logf("forgotten %d times, %d placed at the end", forgets, places)
	assert.Assert(t, forgets > 0, "the bound was reached")
	assert.Assert(t, places <= 50)

	// The control: more of the worktree's own directories than the bound.
	w, before = watched(t, root)
	w.mu.Lock()
	w.maxPlaces = 5
	w.mu.Unlock()
	for d := range 5 {
		write(t, root, fmt.Sprintf("d%d/top.txt", d), "changed")
		write(t, root, fmt.Sprintf("d%d/sub/f0.txt", d), "changed")
	}
	got, why := w.After(context.Background(), before)
	assert.Assert(t, got == nil)
	assert.Equal(t, why, "more than 5 changed directories")
}

// At its bound the watcher drops the outside files After would not read
// (gone, or with one link) and keeps the others: a host writing new files
// all the time no longer makes the snapshot after from the namespace fall
// back, and a write outside through another link of a worktree file is
// still in the report. The control: as many files with two links as the
// bound falls back.
func TestWatcherPrunesOutsideFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("fanotify's filesystem mark needs root")
	}
	ctx := context.Background()
	outside := t.TempDir()
	root := tree(t)
	write(t, outside, "shared.txt", "shared")
	must(t, os.Link(filepath.Join(outside, "shared.txt"), filepath.Join(root, "shared.txt")))
	aged()
	before, why := ScanNamespace(ctx, root, filepath.Join(t.TempDir(), NamespaceCacheFile), nil)
	assert.Equal(t, why, "")
	must(t, before.Settle())
	defer before.Close()
	must(t, before.Ready())
	ref := scan(t, root)
	w, err := Watch(root)
	must(t, err)
	defer w.Close()
	w.mu.Lock()
	w.maxOutside = 100
	w.mu.Unlock()
	must(t, os.WriteFile(filepath.Join(outside, "shared.txt"), []byte("changed outside"), 0o644))
	for i := range 300 {
		p := filepath.Join(outside, fmt.Sprint("new-", i))
		write(t, outside, fmt.Sprint("new-", i), "x")
		if i%2 == 0 {
			must(t, os.Remove(p))
		}
	}
	write(t, root, "d0/top.txt", "the turn's")
	got, why := w.After(ctx, before)
	assert.Equal(t, why, "")
	full := scan(t, root)
	assert.DeepEqual(t, norm(DiffRefs(before, got, nil)), norm(DiffRefs(ref, full, nil)))
	assert.Equal(t, norm(DiffRefs(before, got, nil)).Modified, 2) // d0/top.txt, shared.txt
	w.mu.Lock()
	prunes := w.nPrunes
	w.mu.Unlock()
	assert.Assert(t, prunes > 0, "the bound was reached")

	// The control: more files with two links outside than half the bound.
	w, err = Watch(root)
	must(t, err)
	defer w.Close()
	w.mu.Lock()
	w.maxOutside = 20
	w.mu.Unlock()
	links := t.TempDir()
	for i := range 30 {
		p := filepath.Join(outside, fmt.Sprint("linked-", i))
		must(t, os.WriteFile(p, []byte("x"), 0o644))
		must(t, os.Link(p, filepath.Join(links, fmt.Sprint(i))))
		must(t, os.WriteFile(p, []byte("y"), 0o644))
	}
	before2, why := ScanNamespace(ctx, root, filepath.Join(t.TempDir(), NamespaceCacheFile), nil)
	assert.Equal(t, why, "")
	defer before2.Close()
	must(t, before2.Ready())
	_, why = w.After(ctx, before2)
	assert.Equal(t, why, "too many files changed outside the worktree to place their links")
}
