package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
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

func TestCollectHostileOutbox(t *testing.T) {
	itest.Require(t, itest.Root) // mknod, xattrs in the trusted namespace
	root, task, ob := plainOutbox(t)
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
	assert.NilError(t, os.Link(filepath.Join(host, "secret"), filepath.Join(ob, "hl-host")))
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
	to := filepath.Join(t.TempDir(), "delivery")
	start := time.Now()
	rep, err := Collect(context.Background(), Request{Root: root, Task: task, To: to, Limits: lim, Worktree: wt})
	assert.NilError(t, err)
	assert.Assert(t, time.Since(start) < 10*time.Second, "collect took %s", time.Since(start))

	var got []string
	for _, f := range rep.Files {
		got = append(got, f.Name)
	}
	assert.DeepEqual(t, got, []string{"report.md", "sub/dir/patch.diff", "tool.sh", "x.txt"})

	reasons := map[string]string{}
	for _, r := range rep.Rejected {
		reasons[r.Name] = r.Reason
	}
	for name, want := range map[string]string{
		"shadow": "symbolic link", "up": "symbolic link", "procroot": "symbolic link", "ssh": "symbolic link",
		"sub/esc": "symbolic link", "hostdir": "symbolic link", "fifo": "FIFO", "sock": "socket", "null": "device",
		"hl-a": "hard link", "hl-b": "hard link", "hl-host": "hard link", "sparse": "max_file_size",
		"-rf": `"-"`, `a\nb`: "control", "..x": `".."`, `\xff`: "UTF-8", `esc\x1b[31m`: "control",
		`rtl\u202etxt`: "format", strings.Repeat("n", 150): "max_name_length",
		"d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/": "max_depth",
	} {
		assert.Assert(t, is.Contains(reasons[name], want), "rejection of %q: %q (all: %v)", name, reasons[name], reasons)
	}

	// The delivery: exact contents, normalised modes, no xattrs, no host data.
	host1 := hostDigests(t, filepath.Join(host, "secret"))
	want := map[string]string{"report.md": "# report\n", "sub/dir/patch.diff": "diff --git a b\n", "tool.sh": "#!/bin/sh\necho hi\n", "x.txt": "xattr"}
	for _, f := range rep.Files {
		p := filepath.Join(to, FilesDir, f.Name)
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
	var m Manifest
	b, err := os.ReadFile(filepath.Join(to, ManifestName))
	assert.NilError(t, err)
	assert.NilError(t, json.Unmarshal(b, &m))
	assert.DeepEqual(t, m.Files, rep.Files)
	ents, _ := os.ReadDir(to)
	assert.Equal(t, len(ents), 2, "delivery holds only files/ and the manifest")

	// Moved: delivered sources are gone, rejected ones (and host files) stay.
	for _, n := range []string{"report.md", "sub/dir/patch.diff", "tool.sh", "x.txt"} {
		_, err := os.Lstat(filepath.Join(ob, n))
		assert.Assert(t, os.IsNotExist(err), "%s still in the outbox", n)
	}
	for _, n := range []string{"shadow", "fifo", "sparse", "hl-a", "sub/esc"} {
		_, err := os.Lstat(filepath.Join(ob, n))
		assert.NilError(t, err, "rejected %s must stay", n)
	}
	assert.Assert(t, len(rep.Left) == 0, "%v", rep.Left)
	_, err = os.Stat(filepath.Join(host, "secret"))
	assert.NilError(t, err)
	_, err = os.Stat("/etc/shadow")
	assert.NilError(t, err)

	// Exec allowed keeps the execute bit, never setuid.
	write(t, filepath.Join(ob, "run.sh"), "#!/bin/sh\n", 0o755)
	assert.NilError(t, unix.Chmod(filepath.Join(ob, "run.sh"), 0o4755))
	lim.AllowExec = true
	to2 := filepath.Join(t.TempDir(), "d2")
	rep, err = Collect(context.Background(), Request{Root: root, Task: task, To: to2, Limits: lim})
	assert.NilError(t, err)
	assert.Equal(t, len(rep.Files), 1)
	fi, err := os.Lstat(filepath.Join(to2, FilesDir, "run.sh"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode(), os.FileMode(0o755))
}

func TestCollectManyFilesIsBounded(t *testing.T) {
	root, task, ob := plainOutbox(t)
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
	start := time.Now()
	rep, err := Collect(context.Background(), Request{Root: root, Task: task, To: filepath.Join(t.TempDir(), "d"), Limits: lim})
	assert.NilError(t, err)
	took := time.Since(start)
	t.Logf("100000 files: collect took %s, delivered %d, rejected %d (+%d unlisted)", took, len(rep.Files), len(rep.Rejected), rep.MoreRejected)
	assert.Assert(t, took < 15*time.Second)
	assert.Equal(t, len(rep.Files), lim.MaxFiles)
	assert.Equal(t, rep.Files[0].Name, "big1")
	assert.Equal(t, len(rep.Rejected)+rep.MoreRejected, 100001-lim.MaxFiles+1)
	assert.Equal(t, len(rep.Rejected), maxListedRejections)
	assert.Assert(t, is.Contains(rep.Rejected[0].Reason, "max_total_size"), rep.Rejected[0].Name)
	assert.Assert(t, is.Contains(rep.Rejected[1].Reason, "max_files"))

	// A deadline stops a collect and moves nothing.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	time.Sleep(2 * time.Millisecond)
	to := filepath.Join(t.TempDir(), "late")
	_, err = Collect(ctx, Request{Root: root, Task: task, To: to, Limits: lim})
	assert.ErrorContains(t, err, "did not finish within")
	_, serr := os.Stat(to)
	assert.Assert(t, os.IsNotExist(serr), "partial delivery removed")
	_, serr = os.Stat(filepath.Join(many, "f099999"))
	assert.NilError(t, serr)
}

// TestCollectSwapRace swaps a directory of the outbox with a symbolic link
// to a host directory (renameat2 RENAME_EXCHANGE, tight loop) while collect
// runs again and again: no host data is ever delivered, nothing on the host
// is removed, every collect finishes.
func TestCollectSwapRace(t *testing.T) {
	root, task, ob := plainOutbox(t)
	host := t.TempDir()
	secret := "host secret " + time.Now().String()
	write(t, filepath.Join(host, "data"), secret, 0o644)
	assert.NilError(t, os.Mkdir(filepath.Join(ob, "a"), 0o755))
	// A rejected entry keeps "a" from being removed as emptied.
	assert.NilError(t, os.Symlink("/etc/passwd", filepath.Join(ob, "a", "keep")))
	assert.NilError(t, os.Symlink(host, filepath.Join(ob, "b")))
	realDir, err := unix.Open(filepath.Join(ob, "a"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	assert.NilError(t, err)
	defer unix.Close(realDir)
	obfd, err := unix.Open(ob, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	assert.NilError(t, err)
	defer unix.Close(obfd)

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
	bad := digest([]byte(secret))
	lim := testLimits()
	var delivered, rounds int
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		// Refill the real directory through its pinned fd (never by path).
		fd, err := unix.Openat(realDir, "data", unix.O_CREAT|unix.O_WRONLY|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		assert.NilError(t, err)
		_, err = unix.Write(fd, []byte("outbox data"))
		assert.NilError(t, err)
		unix.Close(fd)
		start := time.Now()
		rep, err := Collect(context.Background(), Request{Root: root, Task: task, To: filepath.Join(t.TempDir(), "d"), Limits: lim})
		assert.NilError(t, err)
		assert.Assert(t, time.Since(start) < 5*time.Second)
		for _, f := range rep.Files {
			assert.Assert(t, f.SHA256 != bad, "host data delivered as %s", f.Name)
			assert.Equal(t, f.SHA256, digest([]byte("outbox data")))
			delivered++
		}
		rounds++
	}
	close(stop)
	swaps := <-done
	t.Logf("%d collects, %d swaps, %d deliveries of the outbox file", rounds, swaps, delivered)
	assert.Assert(t, swaps > 1000, "the race did not run")
	assert.Assert(t, delivered > 0, "positive control: the outbox file is delivered when not swapped")
	b, err := os.ReadFile(filepath.Join(host, "data"))
	assert.NilError(t, err, "host file removed through the swap")
	assert.Equal(t, string(b), secret)
}

func TestCollectBadInput(t *testing.T) {
	root, task, ob := plainOutbox(t)
	write(t, filepath.Join(ob, "f"), "x", 0o644)
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
		{"unknown task", Request{Root: root, Task: "nosuch", To: filepath.Join(out, "a"), Limits: lim}, `task "nosuch" has no outbox`},
		{"bad task id", Request{Root: root, Task: "../etc", To: filepath.Join(out, "a"), Limits: lim}, "invalid task id"},
		{"missing root", Request{Root: filepath.Join(root, "none"), Task: task, To: filepath.Join(out, "a"), Limits: lim}, "outbox root"},
		{"delivery in outbox", Request{Root: root, Task: task, To: filepath.Join(ob, "d"), Limits: lim}, "inside the outbox root"},
		{"delivery in worktree", Request{Root: root, Task: task, To: filepath.Join(wt, "out"), Limits: lim, Worktree: wt}, "inside the worktree"},
		{"delivery is worktree", Request{Root: root, Task: task, To: wt, Limits: lim, Worktree: wt}, "inside the worktree"},
		{"relative delivery", Request{Root: root, Task: task, To: "rel/d", Limits: lim}, "must be an absolute path"},
		{"non-empty delivery", Request{Root: root, Task: task, To: nonEmpty, Limits: lim}, "is not empty"},
		{"no limits", Request{Root: root, Task: task, To: filepath.Join(out, "b")}, "limits are not set"},
	} {
		_, err := Collect(ctx, tc.req)
		assert.ErrorContains(t, err, tc.want, tc.name)
	}
	// A symlink planted as the task's outbox is refused, not followed.
	assert.NilError(t, os.Symlink(wt, filepath.Join(root, "t2")))
	write(t, filepath.Join(wt, "victim"), "v", 0o644)
	_, err := Collect(ctx, Request{Root: root, Task: "t2", To: filepath.Join(out, "c"), Limits: lim})
	assert.ErrorContains(t, err, "symbolic link")
	_, err = os.Stat(filepath.Join(wt, "victim"))
	assert.NilError(t, err)
	// Nothing was lost: the outbox file is still there, and a good request works.
	rep, err := Collect(ctx, Request{Root: root, Task: task, To: filepath.Join(out, "ok"), Limits: lim, Worktree: wt})
	assert.NilError(t, err)
	assert.Equal(t, len(rep.Files), 1)
	// An existing empty directory is accepted as the delivery directory.
	write(t, filepath.Join(ob, "g"), "y", 0o644)
	empty := t.TempDir()
	rep, err = Collect(ctx, Request{Root: root, Task: task, To: empty, Limits: lim})
	assert.NilError(t, err)
	assert.Equal(t, rep.Delivery, empty)
}

func TestListChangesNothing(t *testing.T) {
	root, task, ob := plainOutbox(t)
	write(t, filepath.Join(ob, "a.txt"), "aaa", 0o644)
	assert.NilError(t, os.Symlink("/etc/passwd", filepath.Join(ob, "l")))
	rep, err := List(context.Background(), root, task, testLimits())
	assert.NilError(t, err)
	assert.DeepEqual(t, rep.Files, []File{{Name: "a.txt", Size: 3, SHA256: digest([]byte("aaa")), Mode: "0644"}})
	assert.Equal(t, len(rep.Rejected), 1)
	ents, _ := os.ReadDir(ob)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	assert.DeepEqual(t, names, []string{"a.txt", "l"})
}
