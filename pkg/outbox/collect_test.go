package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

func testLimits() Limits {
	l := DefaultLimits()
	l.MaxNameLength = 100
	l.Timeout = 20 * time.Second
	return l
}

// plainOutbox makes root/task as a plain directory (no tmpfs) for tests
// that plant more than a size-capped outbox would hold.
func plainOutbox(t *testing.T) (root, task, dir string) {
	root = t.TempDir()
	task = "t1"
	dir = filepath.Join(root, task)
	assert.NilError(t, os.Mkdir(dir, 0o755))
	return root, task, dir
}

// liveOutbox mounts root/t1 as a real tmpfs outbox (owned by root, so the
// test plants as the cage would), with room for what the tests plant.
func liveOutbox(t *testing.T) (root, task, dir string) {
	t.Helper()
	itest.Require(t, itest.Root)
	root = t.TempDir()
	task = "t1"
	lim := testLimits()
	lim.Size, lim.Inodes = 64<<20, 1<<17
	_, err := Mount(root, taskid.Must(task), 0, 0, lim, "")
	assert.NilError(t, err)
	t.Cleanup(func() { _ = Release(root, taskid.Must(task)) })
	return root, task, filepath.Join(root, task)
}

// settle moves the live outbox as turn n and checks it is empty afterwards.
func settle(t *testing.T, root, task string, n int, lim Limits) *Moved {
	t.Helper()
	m, err := Settle(context.Background(), root, taskid.Must(task), n, lim)
	assert.NilError(t, err)
	ents, err := os.ReadDir(filepath.Join(root, task))
	assert.NilError(t, err)
	assert.Equal(t, len(ents), 0, "the live outbox is not empty after the move: %v", ents)
	return m
}

func write(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	assert.NilError(t, os.WriteFile(p, []byte(content), mode))
	assert.NilError(t, os.Chmod(p, mode))
}

func digest(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// hostDigests are digests of host files a hostile outbox points at; no
// delivered file may carry one of them.
func hostDigests(t *testing.T, extra ...string) map[string]string {
	m := map[string]string{}
	for _, p := range append([]string{"/etc/shadow", "/etc/passwd", "/etc/hostname", "/proc/self/status"}, extra...) {
		if b, err := os.ReadFile(p); err == nil && len(b) > 0 {
			m[digest(b)] = p
		}
	}
	assert.Assert(t, len(m) >= 2, "need host files to compare against")
	return m
}

func TestCheckName(t *testing.T) {
	for name, want := range map[string]string{
		"report.md": "", "ünïcode ok.txt": "", "a.b": "",
		".": `".."`, "..": `".."`, "a..b": `".."`, "-rf": `"-"`,
		"a\nb": "control", "a\x1bb": "control", "\xff": "UTF-8", "a\u202eb": "format",
		strings.Repeat("x", 101): "max_name_length",
	} {
		got := checkName(name, 100)
		if want == "" {
			assert.Equal(t, got, "", name)
		} else {
			assert.Assert(t, is.Contains(got, want), "%q: %q", name, got)
		}
	}
}

// TestSettleHostileOutbox: what a hostile turn plants in its tmpfs outbox
// is moved at the turn's end as regular files only (links, FIFOs, sockets,
// devices, hard links, bad names, too deep, too big are dropped and
// recorded), leaving the live outbox empty and the host untouched; collect
// then delivers the pending files per turn.
func TestSettleHostileOutbox(t *testing.T) {
	itest.Require(t, itest.Root) // mount, mknod, xattrs in the trusted namespace
	root, task, ob := liveOutbox(t)
	wt := t.TempDir()
	host := t.TempDir()
	write(t, filepath.Join(host, "secret"), "host secret data", 0o600)

	// Valid files (one setuid, one with an xattr, one nested).
	write(t, filepath.Join(ob, "report.md"), "# report\n", 0o644)
	write(t, filepath.Join(ob, "sub", "dir", "patch.diff"), "diff --git a b\n", 0o600)
	write(t, filepath.Join(ob, "tool.sh"), "#!/bin/sh\necho hi\n", 0o4755|os.ModeSetuid)
	assert.NilError(t, unix.Chmod(filepath.Join(ob, "tool.sh"), 0o6755))
	write(t, filepath.Join(ob, "x.txt"), "xattr", 0o644)
	assert.NilError(t, unix.Setxattr(filepath.Join(ob, "x.txt"), "trusted.shrooms", []byte("v"), 0))
	// Links out of the outbox.
	for name, target := range map[string]string{
		"shadow": "/etc/shadow", "up": "../..", "procroot": "/proc/self/root",
		"ssh": "/root/.ssh", "sub/esc": "../../../../../../etc/passwd", "hostdir": host,
	} {
		assert.NilError(t, os.Symlink(target, filepath.Join(ob, name)))
	}
	// Odd files.
	assert.NilError(t, unix.Mkfifo(filepath.Join(ob, "fifo"), 0o666))
	l, err := net.Listen("unix", filepath.Join(ob, "sock"))
	assert.NilError(t, err)
	defer l.Close()
	assert.NilError(t, unix.Mknod(filepath.Join(ob, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	write(t, filepath.Join(ob, "hl-a"), "linked", 0o644)
	assert.NilError(t, os.Link(filepath.Join(ob, "hl-a"), filepath.Join(ob, "hl-b")))
	sparse, err := os.Create(filepath.Join(ob, "sparse"))
	assert.NilError(t, err)
	assert.NilError(t, sparse.Truncate(1<<40))
	sparse.Close()
	// Hostile names.
	for _, n := range []string{"-rf", "a\nb", "..x", "\xff", "esc\x1b[31m", "rtl\u202etxt", strings.Repeat("n", 150)} {
		write(t, filepath.Join(ob, n), "bad name", 0o644)
	}
	// 1000-deep nesting.
	deep := ob
	for i := 0; i < 1000; i++ {
		deep = filepath.Join(deep, "d")
		if len(deep) > 3000 {
			break
		}
	}
	assert.NilError(t, os.MkdirAll(deep, 0o755))
	write(t, filepath.Join(deep, "bottom"), "deep", 0o644)

	lim := testLimits()
	start := time.Now()
	m := settle(t, root, task, 1, lim)
	assert.Assert(t, time.Since(start) < 10*time.Second, "the move took %s", time.Since(start))
	assert.Equal(t, m.Turn, 1)
	assert.Equal(t, m.Pending, filepath.Join(root, PendingDir, task, "1"))

	var got []string
	for _, f := range m.Files {
		got = append(got, f.Name)
	}
	assert.DeepEqual(t, got, []string{"report.md", "sub/dir/patch.diff", "tool.sh", "x.txt"})
	reasons := map[string]string{}
	for _, r := range m.Rejected {
		reasons[r.Name] = r.Reason
	}
	for name, want := range map[string]string{
		"shadow": "symbolic link", "up": "symbolic link", "procroot": "symbolic link", "ssh": "symbolic link",
		"sub/esc": "symbolic link", "hostdir": "symbolic link", "fifo": "FIFO", "sock": "socket", "null": "device",
		"hl-a": "hard link", "hl-b": "hard link", "sparse": "max_file_size",
		"-rf": `"-"`, `a\nb`: "control", "..x": `".."`, `\xff`: "UTF-8", `esc\x1b[31m`: "control",
		`rtl\u202etxt`: "format", strings.Repeat("n", 150): "max_name_length",
		"d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/": "max_depth",
	} {
		assert.Assert(t, is.Contains(reasons[name], want), "rejection of %q: %q (all: %v)", name, reasons[name], reasons)
	}
	// The pending delivery: regular files only, normalised modes, no xattrs.
	pend := filepath.Join(m.Pending, FilesDir)
	assert.NilError(t, filepath.Walk(pend, func(p string, fi os.FileInfo, err error) error {
		assert.NilError(t, err)
		assert.Assert(t, fi.Mode().IsDir() || fi.Mode() == 0o644, "%s: %v", p, fi.Mode())
		return nil
	}))
	_, err = os.Stat(filepath.Join(host, "secret"))
	assert.NilError(t, err)
	_, err = os.Stat("/etc/shadow")
	assert.NilError(t, err)

	// Collect delivers the pending files under files/<turn>/.
	to := filepath.Join(t.TempDir(), "delivery")
	rep, err := Collect(context.Background(), Request{Root: root, Task: taskid.Must(task), To: to, Limits: lim, Worktree: wt})
	assert.NilError(t, err)
	assert.DeepEqual(t, rep.Turns, []int{1})
	got = nil
	for _, f := range rep.Files {
		got = append(got, f.Name)
		assert.Equal(t, f.Turn, 1)
		assert.Equal(t, f.Path, "files/1/"+f.Name)
	}
	assert.DeepEqual(t, got, []string{"report.md", "sub/dir/patch.diff", "tool.sh", "x.txt"})
	dropped := 0
	for _, r := range rep.Rejected {
		assert.Assert(t, r.Dropped && r.Turn == 1, "%v", r)
		dropped++
	}
	assert.Equal(t, dropped, len(m.Rejected), "collect reports what the move dropped")

	// The delivery: exact contents, normalised modes, no xattrs, no host data.
	host1 := hostDigests(t, filepath.Join(host, "secret"))
	want := map[string]string{"report.md": "# report\n", "sub/dir/patch.diff": "diff --git a b\n", "tool.sh": "#!/bin/sh\necho hi\n", "x.txt": "xattr"}
	for _, f := range rep.Files {
		p := filepath.Join(to, f.Path)
		b, err := os.ReadFile(p)
		assert.NilError(t, err)
		assert.Equal(t, string(b), want[f.Name])
		assert.Equal(t, f.SHA256, digest(b))
		_, leak := host1[f.SHA256]
		assert.Assert(t, !leak, "%s carries host data", f.Name)
		fi, err := os.Lstat(p)
		assert.NilError(t, err)
		assert.Equal(t, fi.Mode(), os.FileMode(0o644), f.Name)
		sz, _ := unix.Listxattr(p, make([]byte, 256))
		assert.Equal(t, sz, 0, "%s has xattrs", f.Name)
	}
	// The manifest matches the report and nothing else is in the delivery.
	var man Manifest
	b, err := os.ReadFile(filepath.Join(to, ManifestName))
	assert.NilError(t, err)
	assert.NilError(t, json.Unmarshal(b, &man))
	assert.DeepEqual(t, man.Files, rep.Files)
	ents, _ := os.ReadDir(to)
	assert.Equal(t, len(ents), 2, "delivery holds only files/ and the manifest")
	// Collected: the pending turn is gone.
	_, err = os.Stat(m.Pending)
	assert.Assert(t, os.IsNotExist(err), "the collected turn is still pending")
	assert.Assert(t, len(rep.Left) == 0, "%v", rep.Left)

	// Exec allowed keeps the execute bit, never setuid; a second turn has
	// its own directory.
	lim.AllowExec = true
	big := lim
	big.Size, big.Inodes = 4<<20, 64
	_, err = Mount(root, taskid.Must(task), 0, 0, big, "")
	assert.NilError(t, err)
	write(t, filepath.Join(ob, "run.sh"), "#!/bin/sh\n", 0o755)
	assert.NilError(t, unix.Chmod(filepath.Join(ob, "run.sh"), 0o4755))
	settle(t, root, task, 2, lim)
	to2 := filepath.Join(t.TempDir(), "d2")
	rep, err = Collect(context.Background(), Request{Root: root, Task: taskid.Must(task), To: to2, Limits: lim})
	assert.NilError(t, err)
	assert.Equal(t, len(rep.Files), 1)
	fi, err := os.Lstat(filepath.Join(to2, FilesDir, "2", "run.sh"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode(), os.FileMode(0o755))
}

func TestSettleManyFilesIsBounded(t *testing.T) {
	root, task, ob := liveOutbox(t)
	many := filepath.Join(ob, "many")
	assert.NilError(t, os.Mkdir(many, 0o755))
	for i := 0; i < 100000; i++ {
		fd, err := unix.Open(filepath.Join(many, fmt.Sprintf("f%06d", i)), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		assert.NilError(t, err)
		unix.Close(fd)
	}
	write(t, filepath.Join(ob, "big1"), strings.Repeat("a", 3000), 0o644)
	write(t, filepath.Join(ob, "big2"), strings.Repeat("b", 3000), 0o644)
	lim := testLimits()
	lim.MaxTotalSize = 4000
	lim.MaxFileSize = 4000

	// A deadline stops the move: nothing is moved, the outbox stays (and
	// Mount refuses to hand it to another turn).
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	time.Sleep(2 * time.Millisecond)
	_, err := Settle(ctx, root, taskid.Must(task), 1, lim)
	assert.ErrorContains(t, err, "did not finish within")
	_, serr := os.Stat(filepath.Join(Pending(root, taskid.Must(task)), "1"))
	assert.Assert(t, os.IsNotExist(serr), "partial pending turn left")
	_, serr = os.Stat(filepath.Join(many, "f099999"))
	assert.NilError(t, serr)
	_, err = Mount(root, taskid.Must(task), 0, 0, lim, "")
	assert.ErrorContains(t, err, "still mounted with an earlier turn's files")

	start := time.Now()
	m := settle(t, root, task, 1, lim)
	took := time.Since(start)
	t.Logf("100000 files: the move took %s, moved %d, dropped %d (+%d unlisted)", took, len(m.Files), len(m.Rejected), m.MoreRejected)
	assert.Assert(t, took < 15*time.Second)
	assert.Equal(t, len(m.Files), lim.MaxFiles)
	assert.Equal(t, m.Files[0].Name, "big1")
	assert.Equal(t, len(m.Rejected)+m.MoreRejected, 100001-lim.MaxFiles+1)
	assert.Equal(t, len(m.Rejected), maxListedRejections)
	assert.Assert(t, is.Contains(m.Rejected[0].Reason, "max_total_size"), m.Rejected[0].Name)
	assert.Assert(t, is.Contains(m.Rejected[1].Reason, "max_files"))
	rep, err := List(context.Background(), root, taskid.Must(task), lim)
	assert.NilError(t, err)
	assert.Equal(t, len(rep.Files), lim.MaxFiles)
}

// TestSettleSwapRace swaps a directory of the outbox with a symbolic link
// to a host directory (renameat2 RENAME_EXCHANGE, tight loop) while the
// turn's outbox is moved, again and again: no host data is ever moved,
// nothing on the host is removed, every move finishes.
func TestSettleSwapRace(t *testing.T) {
	itest.Require(t, itest.Root)
	root := t.TempDir()
	task := "t1"
	ob := filepath.Join(root, task)
	host := t.TempDir()
	secret := "host secret " + time.Now().String()
	write(t, filepath.Join(host, "data"), secret, 0o644)
	bad := digest([]byte(secret))
	lim := testLimits()
	mlim := lim
	mlim.Size, mlim.Inodes = 1<<20, 64
	var moved, rounds, swaps int
	deadline := time.Now().Add(3 * time.Second)
	for turn := 1; time.Now().Before(deadline); turn++ {
		_, err := Mount(root, taskid.Must(task), 0, 0, mlim, "")
		assert.NilError(t, err)
		write(t, filepath.Join(ob, "a", "data"), "outbox data", 0o644)
		// A rejected entry keeps "a" from being simply emptied.
		assert.NilError(t, os.Symlink("/etc/passwd", filepath.Join(ob, "a", "keep")))
		assert.NilError(t, os.Symlink(host, filepath.Join(ob, "b")))
		obfd, err := unix.Open(ob, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		assert.NilError(t, err)
		stop := make(chan struct{})
		done := make(chan int)
		go func() {
			n := 0
			for {
				select {
				case <-stop:
					done <- n
					return
				default:
				}
				if unix.Renameat2(obfd, "a", obfd, "b", unix.RENAME_EXCHANGE) == nil {
					n++
				}
			}
		}()
		start := time.Now()
		m, err := Settle(context.Background(), root, taskid.Must(task), turn, lim)
		close(stop)
		swaps += <-done
		unix.Close(obfd)
		assert.NilError(t, err)
		assert.Assert(t, time.Since(start) < 5*time.Second)
		for _, f := range m.Files {
			assert.Assert(t, f.SHA256 != bad, "host data moved as %s", f.Name)
			assert.Equal(t, f.SHA256, digest([]byte("outbox data")))
			moved++
		}
		rounds++
	}
	t.Logf("%d moves, %d swaps, %d moves of the outbox file", rounds, swaps, moved)
	assert.Assert(t, swaps > 1000, "the race did not run")
	assert.Assert(t, moved > 0, "positive control: the outbox file is moved when not swapped")
	b, err := os.ReadFile(filepath.Join(host, "data"))
	assert.NilError(t, err, "host file removed through the swap")
	assert.Equal(t, string(b), secret)
}

// TestSettleBareDirectory: a bare outbox directory holding files (a cage
// given it without its tmpfs, or an older shrooms' leftover) is moved out
// of the cages' reach, its regular files into the pending turn, and left
// empty: Mount refuses it until then.
func TestSettleBareDirectory(t *testing.T) {
	root, task, ob := plainOutbox(t)
	write(t, filepath.Join(ob, "r.txt"), "report", 0o644)
	assert.NilError(t, os.Symlink("/etc/passwd", filepath.Join(ob, "l")))
	if itest.Required() || os.Geteuid() == 0 {
		_, err := Mount(root, taskid.Must(task), 0, 0, testLimits(), "")
		assert.ErrorContains(t, err, "is not empty")
	}
	m := settle(t, root, task, 3, testLimits())
	assert.Equal(t, len(m.Files), 1)
	assert.Equal(t, m.Files[0].Name, "r.txt")
	assert.Equal(t, m.Rejected[0].Name, "l")
	ents, err := os.ReadDir(Pending(root, taskid.Must(task)))
	assert.NilError(t, err)
	assert.Equal(t, len(ents), 1, "only the pending turn, no quarantine left: %v", ents)
	assert.Equal(t, ents[0].Name(), "3")
	_, err = os.Stat("/etc/passwd")
	assert.NilError(t, err)
}

func TestCollectBadInput(t *testing.T) {
	root, task, ob := plainOutbox(t)
	write(t, filepath.Join(ob, "f"), "x", 0o644)
	settle(t, root, task, 1, testLimits())
	wt := t.TempDir()
	lim := testLimits()
	ctx := context.Background()
	out := t.TempDir()
	nonEmpty := t.TempDir()
	write(t, filepath.Join(nonEmpty, "keep"), "k", 0o644)
	for _, tc := range []struct {
		name string
		req  Request
		want string
	}{
		{"no task id", Request{Root: root, To: filepath.Join(out, "a"), Limits: lim}, "no task id"},
		{"missing root", Request{Root: filepath.Join(root, "none"), Task: taskid.Must(task), To: filepath.Join(out, "a"), Limits: lim}, "outbox root"},
		{"delivery in outbox", Request{Root: root, Task: taskid.Must(task), To: filepath.Join(ob, "d"), Limits: lim}, "inside the outbox root"},
		{"delivery in pending", Request{Root: root, Task: taskid.Must(task), To: filepath.Join(Pending(root, taskid.Must(task)), "d"), Limits: lim}, "inside the outbox root"},
		{"delivery in worktree", Request{Root: root, Task: taskid.Must(task), To: filepath.Join(wt, "out"), Limits: lim, Worktree: wt}, "inside the worktree"},
		{"delivery is worktree", Request{Root: root, Task: taskid.Must(task), To: wt, Limits: lim, Worktree: wt}, "inside the worktree"},
		{"relative delivery", Request{Root: root, Task: taskid.Must(task), To: "rel/d", Limits: lim}, "must be an absolute path"},
		{"non-empty delivery", Request{Root: root, Task: taskid.Must(task), To: nonEmpty, Limits: lim}, "is not empty"},
		{"no limits", Request{Root: root, Task: taskid.Must(task), To: filepath.Join(out, "b")}, "limits are not set"},
	} {
		_, err := Collect(ctx, tc.req)
		assert.ErrorContains(t, err, tc.want, tc.name)
	}
	// A symlink planted as a task's pending deliveries is refused, not followed.
	assert.NilError(t, os.Symlink(wt, filepath.Join(root, PendingDir, "t2")))
	write(t, filepath.Join(wt, "victim"), "v", 0o644)
	_, err := Collect(ctx, Request{Root: root, Task: taskid.Must("t2"), To: filepath.Join(out, "c"), Limits: lim})
	assert.ErrorContains(t, err, "symbolic link")
	_, err = os.Stat(filepath.Join(wt, "victim"))
	assert.NilError(t, err)
	// A task with nothing pending collects nothing.
	rep, err := Collect(ctx, Request{Root: root, Task: taskid.Must("t3"), To: filepath.Join(out, "none"), Limits: lim})
	assert.NilError(t, err)
	assert.Equal(t, len(rep.Files), 0)
	// Nothing was lost: the pending file is still there, and a good request works.
	rep, err = Collect(ctx, Request{Root: root, Task: taskid.Must(task), To: filepath.Join(out, "ok"), Limits: lim, Worktree: wt})
	assert.NilError(t, err)
	assert.Equal(t, len(rep.Files), 1)
	// An existing empty directory is accepted as the delivery directory.
	write(t, filepath.Join(ob, "g"), "y", 0o644)
	settle(t, root, task, 2, lim)
	empty := t.TempDir()
	rep, err = Collect(ctx, Request{Root: root, Task: taskid.Must(task), To: empty, Limits: lim})
	assert.NilError(t, err)
	assert.Equal(t, rep.Delivery, empty)
	assert.Equal(t, len(rep.Files), 1)
}

// TestPendingTurnsDoNotCollide: two turns leave files of the same name;
// each keeps its own pending directory, list shows both, and collect
// delivers both under files/<turn>/.
func TestPendingTurnsDoNotCollide(t *testing.T) {
	root, task, ob := plainOutbox(t)
	write(t, filepath.Join(ob, "report.md"), "turn 1", 0o644)
	settle(t, root, task, 1, testLimits())
	write(t, filepath.Join(ob, "report.md"), "turn 2", 0o644)
	settle(t, root, task, 2, testLimits())
	rep, err := List(context.Background(), root, taskid.Must(task), testLimits())
	assert.NilError(t, err)
	assert.DeepEqual(t, rep.Turns, []int{1, 2})
	assert.DeepEqual(t, rep.Files, []File{
		{Name: "report.md", Size: 6, SHA256: digest([]byte("turn 1")), Mode: "0644", Turn: 1},
		{Name: "report.md", Size: 6, SHA256: digest([]byte("turn 2")), Mode: "0644", Turn: 2},
	})
	to := filepath.Join(t.TempDir(), "d")
	_, err = Collect(context.Background(), Request{Root: root, Task: taskid.Must(task), To: to, Limits: testLimits()})
	assert.NilError(t, err)
	for n, want := range map[string]string{"1": "turn 1", "2": "turn 2"} {
		b, err := os.ReadFile(filepath.Join(to, FilesDir, n, "report.md"))
		assert.NilError(t, err)
		assert.Equal(t, string(b), want)
	}
	rep, err = List(context.Background(), root, taskid.Must(task), testLimits())
	assert.NilError(t, err)
	assert.Equal(t, len(rep.Files)+len(rep.Turns), 0, "collected turns are no longer pending")
}

func TestListChangesNothing(t *testing.T) {
	root, task, ob := plainOutbox(t)
	write(t, filepath.Join(ob, "a.txt"), "aaa", 0o644)
	assert.NilError(t, os.Symlink("/etc/passwd", filepath.Join(ob, "l")))
	settle(t, root, task, 1, testLimits())
	for i := 0; i < 2; i++ {
		rep, err := List(context.Background(), root, taskid.Must(task), testLimits())
		assert.NilError(t, err)
		assert.DeepEqual(t, rep.Files, []File{{Name: "a.txt", Size: 3, SHA256: digest([]byte("aaa")), Mode: "0644", Turn: 1}})
		assert.DeepEqual(t, rep.Rejected, []Rejected{{Name: "l", Reason: "symbolic link (not followed)", Turn: 1, Dropped: true}})
	}
	ents, _ := os.ReadDir(filepath.Join(Pending(root, taskid.Must(task)), "1", FilesDir))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	assert.DeepEqual(t, names, []string{"a.txt"})
}
