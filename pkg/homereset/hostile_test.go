package homereset

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
)

// hostTargets are host paths the hostile HOME points at; their digest must
// not change.
func hostTargets(t *testing.T) (string, func() string) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "secret"), "host secret")
	write(t, filepath.Join(dir, "sub/file"), "host file")
	return dir, func() string {
		d, _ := treeDigest(t, dir)
		etc, _ := os.ReadFile("/etc/passwd")
		host, _ := os.ReadFile("/etc/hostname")
		st, _ := os.Stat("/etc")
		return fmt.Sprintf("%s %x %x %v", d, etc, host, st.ModTime())
	}
}

func TestHostileTrees(t *testing.T) {
	task := newTask(t, "claude", "opencode", "shell")
	ctx := context.Background()
	_, err := Bootstrap(ctx, task)
	assert.NilError(t, err)
	home := HomeDir(task.Root)
	host, digest := hostTargets(t)
	before := digest()

	// Keep-list paths of every wrong type.
	assert.NilError(t, os.Remove(filepath.Join(home, ".claude/.credentials.json")))
	assert.NilError(t, os.Symlink(filepath.Join(host, "secret"), filepath.Join(home, ".claude/.credentials.json")))
	assert.NilError(t, syscall.Mkfifo(filepath.Join(home, ".claude.json"), 0o666))
	assert.NilError(t, os.Remove(filepath.Join(home, ".local/share/opencode/auth.json")))
	assert.NilError(t, os.MkdirAll(filepath.Join(home, ".local/share/opencode/auth.json/x"), 0o755))
	big, err := os.Create(filepath.Join(home, ".claude/history.jsonl"))
	assert.NilError(t, err)
	assert.NilError(t, big.Truncate(2<<30))
	big.Close()
	write(t, filepath.Join(home, ".local/share/opencode/opencode.db"), "not sqlite")
	// A kept directory that is a symlink to the host, and a symlink farm.
	assert.NilError(t, os.MkdirAll(filepath.Join(home, ".claude/projects"), 0o755))
	assert.NilError(t, os.Symlink(host, filepath.Join(home, ".claude/projects/-work")))
	assert.NilError(t, os.Symlink("/etc", filepath.Join(home, ".claude/file-history")))
	for i := 0; i < 50; i++ {
		assert.NilError(t, os.Symlink([]string{"/", "/etc", "/etc/passwd", host}[i%4], filepath.Join(home, fmt.Sprintf("farm%d", i))))
	}
	// Hostile modes and deep nesting.
	deep := filepath.Join(home, "deep")
	assert.NilError(t, os.MkdirAll(deep, 0o755))
	d, err := os.Open(deep)
	assert.NilError(t, err)
	for i := 0; i < 300; i++ {
		assert.NilError(t, syscall.Mkdirat(int(d.Fd()), "d", 0o755))
		fd, err := syscall.Openat(int(d.Fd()), "d", syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
		assert.NilError(t, err)
		d.Close()
		d = os.NewFile(uintptr(fd), "d")
	}
	d.Close()
	write(t, filepath.Join(home, "locked/inner/f"), "x")
	assert.NilError(t, os.Chmod(filepath.Join(home, "locked/inner"), 0))
	assert.NilError(t, os.Chmod(filepath.Join(home, "locked"), 0))
	assert.NilError(t, syscall.Mkfifo(filepath.Join(home, "fifo"), 0o666))

	rep, err := Reset(ctx, ResetInput{Task: task})
	assert.NilError(t, err)
	w := strings.Join(rep.Warnings, "\n")
	for _, want := range []string{
		"dropped .claude/.credentials.json: is a symlink",
		"dropped .claude.json: is a FIFO",
		"dropped .local/share/opencode/auth.json: is a directory",
		"dropped .claude/history.jsonl: is 2147483648 bytes, over",
		"dropped .local/share/opencode/opencode.db: does not start with the expected file signature",
		"dropped .claude/projects/-work: is a symlink",
	} {
		assert.Assert(t, strings.Contains(w, want), "missing warning %q in:\n%s", want, w)
	}
	// The dropped ~/.claude.json is replaced by shrooms' seeds alone.
	assert.DeepEqual(t, files(t, home), []string{".claude.json", ".claude/CLAUDE.md", ".claude/settings.json", ".config/opencode/opencode.json", ".gitconfig", ".profile"})
	assert.DeepEqual(t, rep.Seeded, []string{".claude.json"})
	crep, err := Cleanup(ctx, task.Root)
	assert.NilError(t, err)
	assert.Equal(t, len(crep.Errors), 0, "%v", crep.Errors)
	assert.Assert(t, crep.Dirs >= 300)
	assert.Equal(t, digest(), before, "host changed")
}

// TestSwapWhileResetting races a process that keeps swapping a kept
// directory for a symlink to the host against resets and cleanups.
func TestSwapWhileResetting(t *testing.T) {
	task := newTask(t, "claude")
	ctx := context.Background()
	_, err := Bootstrap(ctx, task)
	assert.NilError(t, err)
	host, digest := hostTargets(t)
	before := digest()
	var stop atomic.Bool
	done := make(chan struct{})
	// The racer works only fd-relative from real directories, so that it can
	// never itself write through the links it plants.
	go func() {
		defer close(done)
		for !stop.Load() {
			for _, base := range append([]string{HomeDir(task.Root)}, globTrash(task.Root)...) {
				b, err := os.OpenFile(base, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_DIRECTORY, 0)
				if err != nil {
					continue
				}
				claude, err := openDir(b, ".claude", devOf(b))
				b.Close()
				if err != nil {
					continue
				}
				fd := int(claude.Fd())
				for _, target := range []string{"/etc", host} {
					_ = unix.Renameat(fd, "projects", fd, "projects.real")
					_ = unix.Symlinkat(target, fd, "projects")
					_ = unix.Unlinkat(fd, "projects", 0)
					_ = unix.Renameat(fd, "projects.real", fd, "projects")
				}
				claude.Close()
			}
		}
	}()
	for i := 0; i < 40; i++ {
		h, err := os.OpenFile(HomeDir(task.Root), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_DIRECTORY, 0)
		assert.NilError(t, err)
		if d, err := mkdirAll(h, ".claude/projects/-work", 0, 0, devOf(h)); err == nil {
			for j := 0; j < 20; j++ {
				_ = writeFileAt(d, fmt.Sprintf("s%d.jsonl", j), []byte("{}\n"), 0o600, 0, 0)
			}
			d.Close()
		}
		h.Close()
		_, err = Reset(ctx, ResetInput{Task: task})
		assert.NilError(t, err)
		_, err = Cleanup(ctx, task.Root)
		assert.NilError(t, err)
	}
	stop.Store(true)
	<-done
	assert.Equal(t, digest(), before, "host changed")
	// No symlink survives into a HOME.
	_ = filepath.Walk(HomeDir(task.Root), func(p string, info os.FileInfo, err error) error {
		if err == nil {
			assert.Assert(t, info.Mode()&os.ModeSymlink == 0 || strings.Contains(p, "projects"), p)
		}
		return nil
	})
}

func globTrash(root string) []string {
	m, _ := filepath.Glob(filepath.Join(root, ".shrooms/trash/*"))
	return m
}

func devOf(f *os.File) uint64 {
	var st unix.Stat_t
	_ = unix.Fstat(int(f.Fd()), &st)
	return uint64(st.Dev)
}
