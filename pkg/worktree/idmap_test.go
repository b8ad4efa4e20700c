package worktree

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/worktree/diff"
)

const (
	idOwner = 41001 // the worktree's owner on the host
	idAgent = 52001 // the task agent's host uid
)

// asAgent runs script with sh as the task agent's host uid (what the cage's
// agent is on the host), returning its output and error.
func asAgent(t *testing.T, script string) (string, error) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: idAgent, Gid: idAgent}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// idmapFixture is a worktree owned by idOwner in a directory only root may
// enter (the gate), with a file of the owner, one of root, and a nested
// repository of the owner; and claims whose state directory is a temp dir.
func idmapFixture(t *testing.T) (Claims, Holder, string) {
	t.Helper()
	itest.Require(t, itest.Root)
	dir := t.TempDir()
	// The agent's sh must reach the staging below (the test's own dirs).
	assert.NilError(t, os.Chmod(dir, 0o711))
	assert.NilError(t, os.Chmod(filepath.Dir(dir), 0o711))
	gate := filepath.Join(dir, "gate")
	assert.NilError(t, os.Mkdir(gate, 0o700))
	wt := filepath.Join(gate, "wt")
	for _, d := range []string{wt, wt + "/sub", wt + "/sub/.git", wt + "/sub/.git/objects", wt + "/sub/.git/refs"} {
		assert.NilError(t, os.Mkdir(d, 0o755))
	}
	assert.NilError(t, os.WriteFile(wt+"/sub/.git/HEAD", []byte("ref: refs/heads/main\n"), 0o644))
	assert.NilError(t, os.WriteFile(wt+"/sub/.git/config", nil, 0o644))
	assert.NilError(t, os.WriteFile(wt+"/f", []byte("a\n"), 0o644))
	assert.NilError(t, os.WriteFile(wt+"/sub/file", nil, 0o644))
	assert.NilError(t, filepath.Walk(wt, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, idOwner, idOwner)
	}))
	assert.NilError(t, os.WriteFile(wt+"/rootfile", nil, 0o644))
	// The owner's own setuid file from before the turn keeps its bit.
	assert.NilError(t, os.WriteFile(wt+"/ownsuid", nil, 0o755))
	assert.NilError(t, os.Lchown(wt+"/ownsuid", idOwner, idOwner))
	assert.NilError(t, syscall.Chmod(wt+"/ownsuid", 0o4755))
	task, err := taskid.Parse("idmap-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))
	assert.NilError(t, err)
	state := filepath.Join(dir, "state")
	assert.NilError(t, os.Mkdir(state, 0o711))
	c := Claims{Layout: taskstate.Layout{Dir: state}, Store: taskstate.Store{Dir: state}}
	holder := mustHolder(t, c, task)
	t.Cleanup(func() { _ = c.releaseIdmap(holder); _ = os.Remove(c.idmapDir()) })
	return c, holder, wt
}

// stageFixture stages the fixture's worktree as a turn does and returns
// the staging directory, reachable by the agent's uid for the test (a
// turn's is root's only: the cage binds it).
func stageFixture(t *testing.T, c Claims, task Holder, wt string) string {
	t.Helper()
	_, nested, err := scanNested(context.Background(), wt)
	assert.NilError(t, err)
	assert.DeepEqual(t, mapKeys(nested), []string{"sub/.git"})
	// The owner's files are from before the turn's clock tick (a file the
	// owner changes within a tick of the turn's start counts as the turn's).
	time.Sleep(20 * time.Millisecond)
	start, err := coarseNow()
	assert.NilError(t, err)
	rec := &idmapRecord{Worktree: wt, Owner: [2]uint32{idOwner, idOwner}, Agent: [2]uint32{idAgent, idAgent}, Nested: nested, Start: start}
	assert.NilError(t, c.stage(task.staging, wt, rec))
	assert.NilError(t, writeRecord(task.turn, rec))
	assert.NilError(t, os.Chmod(idmapRoot, 0o711))
	assert.NilError(t, os.Chmod(c.idmapDir(), 0o711))
	t.Cleanup(func() { _ = os.Chmod(idmapRoot, 0o700) })
	return task.StagingDir()
}

func mapKeys(m map[string]uint64) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// TestIdmapStagedWorktree: through the staging mount the agent's uid owns
// the owner's files and writes them, and what it makes lands owned by the
// owner on disk; root's file is not writable; the owner's nested repository
// is read-only (its work tree beside it writable) and cannot be moved away.
func TestIdmapStagedWorktree(t *testing.T) {
	c, task, wt := idmapFixture(t)
	// Positive control: without the mount the agent can write nothing.
	_, err := asAgent(t, "echo b >> "+wt+"/f")
	assert.Assert(t, err != nil)
	st := stageFixture(t, c, task, wt)

	out, err := asAgent(t, "cd "+st+" && stat -c %u f && echo b >> f && echo n > new && mkdir d && echo x > d/g && echo s > sub/file")
	assert.NilError(t, err, out)
	assert.Equal(t, strings.TrimSpace(strings.Split(out, "\n")[0]), "52001")
	for _, p := range []string{"f", "new", "d", "d/g", "sub/file"} {
		u, g := owner(t, filepath.Join(wt, p))
		assert.Equal(t, u, uint32(idOwner), p)
		assert.Equal(t, g, uint32(idOwner), p)
	}
	b, err := os.ReadFile(wt + "/f")
	assert.NilError(t, err)
	assert.Equal(t, string(b), "a\nb\n")

	out, err = asAgent(t, "echo x >> "+st+"/rootfile")
	assert.Assert(t, err != nil, out)
	assert.Assert(t, strings.Contains(out, "Permission denied"), out)
	out, err = asAgent(t, "echo x >> "+st+"/sub/.git/config")
	assert.Assert(t, err != nil, out)
	assert.Assert(t, strings.Contains(out, "Read-only file system"), out)
	out, err = asAgent(t, "mv "+st+"/sub/.git "+st+"/sub/moved")
	assert.Assert(t, err != nil, out)
	_, err = os.Stat(wt + "/sub/.git/HEAD")
	assert.NilError(t, err)

	// Detached: the staging directory is empty again (and again after a
	// second stage left below a first: a crash).
	assert.NilError(t, c.Unstage(task))
	_, err = os.Stat(st + "/f")
	assert.Assert(t, os.IsNotExist(err), err)
	rec, err := readRecord(task.turn)
	assert.NilError(t, err)
	assert.NilError(t, c.stage(task.staging, wt, rec))
	assert.NilError(t, unixMoveAgain(c, task, wt, rec))
	assert.NilError(t, c.Unstage(task))
	_, err = os.Stat(st + "/f")
	assert.Assert(t, os.IsNotExist(err), err)
}

// unixMoveAgain mounts a second idmapped tree over the staged one, as a
// crashed turn followed by a stage that skipped the detach would.
func unixMoveAgain(c Claims, task Holder, wt string, rec *idmapRecord) error {
	fd, err := idmappedTree(wt, rec.Owner[0], rec.Owner[1], rec.Agent[0], rec.Agent[1], true)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	return moveTo(fd, task.StagingDir())
}

// TestIdmapGiveBack: after an idmapped turn, a setuid/setgid file the turn
// made loses the bits (the owner's older one keeps its), and a nested
// repository the turn made — a .git directory or pointer file, a bare
// layout, an existing directory the turn made one — goes to the agent's uid
// without access for others; the owner's nested repository stays the
// owner's. Both give-backs: the whole walk (GiveBack's, after a crash) and
// the one over the turn's changes (from its events).
func TestIdmapGiveBack(t *testing.T) {
	for _, mode := range []string{"walk", "changed", "clock stepped"} {
		t.Run(mode, func(t *testing.T) { idmapGiveBack(t, mode) })
	}
}

func idmapGiveBack(t *testing.T, mode string) {
	c, task, wt := idmapFixture(t)
	assert.NilError(t, os.Mkdir(wt+"/x", 0o755))
	assert.NilError(t, os.Lchown(wt+"/x", idOwner, idOwner))
	st := stageFixture(t, c, task, wt)
	before, err := diff.Scan(context.Background(), wt)
	assert.NilError(t, err)
	out, err := asAgent(t, "cd "+st+" && echo x > s && chmod 4755 s && echo y > g && chmod 2755 g && mkdir -p n/.git/objects n/.git/refs && echo ref > n/.git/HEAD && mkdir -p bare/objects bare/refs && echo r > bare/HEAD && mkdir p && echo 'gitdir: /elsewhere' > p/.git && mkdir x/objects x/refs && echo r > x/HEAD")
	assert.NilError(t, err, out)
	// Positive control: the host sees the setuid file, the owner's.
	fi, err := os.Stat(wt + "/s")
	assert.NilError(t, err)
	assert.Assert(t, fi.Mode()&os.ModeSetuid != 0)
	u, _ := owner(t, wt+"/n/.git/HEAD")
	assert.Equal(t, u, uint32(idOwner))

	var rep *Report
	if mode == "clock stepped" {
		// The turn's clock was set: every setuid file goes, the owner's
		// own too (its ctime says nothing then).
		assert.NilError(t, c.ClockStepped(task.Idmap))
	}
	if mode != "changed" {
		var done bool
		rep, done, err = c.giveBackIdmapped(task.staging, task.turn, wt)
		assert.Assert(t, done)
	} else {
		after, serr := diff.Scan(context.Background(), wt)
		assert.NilError(t, serr)
		rep, err = c.GiveBackChanged(task.Idmap, wt, diff.Changed(before, after))
	}
	assert.NilError(t, err)
	stripped := 2
	if mode == "clock stepped" {
		stripped = 3
	}
	assert.Equal(t, rep.Stripped, stripped)
	assert.DeepEqual(t, rep.KeptNestedRepos, []string{"bare", "n/.git", "p/.git", "x"})
	for _, p := range []string{"s", "g"} {
		fi, err := os.Stat(filepath.Join(wt, p))
		assert.NilError(t, err)
		assert.Equal(t, fi.Mode()&(os.ModeSetuid|os.ModeSetgid), os.FileMode(0), p)
	}
	fi, err = os.Stat(wt + "/ownsuid")
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode()&os.ModeSetuid != 0, mode != "clock stepped")
	for _, p := range []string{"n/.git", "n/.git/HEAD", "n/.git/objects", "bare", "bare/HEAD", "p/.git", "x", "x/HEAD"} {
		u, _ := owner(t, filepath.Join(wt, p))
		assert.Equal(t, u, uint32(idAgent), p)
	}
	fi, err = os.Stat(wt + "/n/.git")
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm()&0o007, os.FileMode(0))
	u, _ = owner(t, wt+"/sub/.git/config")
	assert.Equal(t, u, uint32(idOwner))
	// The staging mount went with the give-back, and so did the record.
	_, err = os.Stat(st + "/f")
	assert.Assert(t, os.IsNotExist(err), err)
	_, err = os.Stat(task.turn)
	assert.Assert(t, os.IsNotExist(err), err)
}

// TestIdmapHostReason: a gated worktree of a user gets the idmap; one of
// root, or one other users can reach, does not.
func TestIdmapHostReason(t *testing.T) {
	_, _, wt := idmapFixture(t)
	assert.Equal(t, IdmapHostReason(wt, idOwner, idOwner, idAgent, idAgent), "")
	assert.Assert(t, strings.Contains(IdmapHostReason(wt, 0, idOwner, idAgent, idAgent), "owned by root"))
	assert.Assert(t, strings.Contains(IdmapHostReason(wt, idOwner, 0, idAgent, idAgent), "group root"))
	assert.NilError(t, os.Chmod(filepath.Dir(wt), 0o755)) // the gate opened
	assert.Assert(t, strings.Contains(IdmapHostReason(wt, idOwner, idOwner, idAgent, idAgent), "other users can reach"))
}

// TestIdmapReasonDecidesEveryReason: the plan's one question. On a
// worktree the host can idmap the answer is "" (the positive control);
// the same worktree under gVisor, or with worktree.idmap = "off", keeps
// the chown walks, saying why; NewClaims tells gVisor by cage.runtime.
func TestIdmapReasonDecidesEveryReason(t *testing.T) {
	c, task, wt := idmapFixture(t)
	ids := taskstate.IDs{UID: idAgent, GID: idAgent} // User 0: the agent's ids are these
	assert.Equal(t, c.IdmapReason(task, wt, ids), "", "positive control: this host idmaps the fixture")
	g := c
	g.GVisor = true
	assert.Equal(t, g.IdmapReason(task, wt, ids), "gVisor cages keep the chown walks")
	off := c
	off.Cap.Idmap = "off"
	assert.Equal(t, off.IdmapReason(task, wt, ids), `worktree.idmap = "off"`)

	cfg := config.Default()
	cfg.Cage.Runtime = "/usr/local/bin/runsc"
	assert.Assert(t, NewClaims(cfg).GVisor)
	cfg.Cage.Runtime = "runc"
	assert.Assert(t, !NewClaims(cfg).GVisor)
}

// TestIdmapStageChecksTheGate: the gate is checked again on the directory
// staged, by descriptor: opened after the plan checked it, or the path
// swapped for a link to an open directory of the owner, the staging is
// refused and nothing is mounted; restored, the same staging succeeds (the
// positive control).
func TestIdmapStageChecksTheGate(t *testing.T) {
	c, task, wt := idmapFixture(t)
	gate := filepath.Dir(wt)
	assert.Equal(t, IdmapHostReason(wt, idOwner, idOwner, idAgent, idAgent), "", "the plan's check passes")
	rec := &idmapRecord{Worktree: wt, Owner: [2]uint32{idOwner, idOwner}, Agent: [2]uint32{idAgent, idAgent}, Nested: map[string]uint64{}}
	mounted := func() bool {
		_, err := os.Lstat(filepath.Join(task.StagingDir(), "f"))
		return err == nil
	}

	// Opened after the check.
	assert.NilError(t, os.Chmod(gate, 0o755))
	assert.ErrorContains(t, c.stage(task.staging, wt, rec), "other users can reach the worktree")
	assert.Assert(t, !mounted())
	assert.NilError(t, os.Chmod(gate, 0o700))

	// The gated directory moved away and a link to an open tree of the
	// owner's put in its place.
	open := filepath.Join(filepath.Dir(gate), "open")
	assert.NilError(t, os.Mkdir(open, 0o755))
	assert.NilError(t, os.Mkdir(filepath.Join(open, "wt"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(open, "wt", "f"), nil, 0o644))
	for _, p := range []string{open, filepath.Join(open, "wt"), filepath.Join(open, "wt", "f")} {
		assert.NilError(t, os.Lchown(p, idOwner, idOwner))
	}
	moved := gate + ".moved"
	assert.NilError(t, os.Rename(gate, moved))
	assert.NilError(t, os.Symlink(open, gate))
	err := c.stage(task.staging, wt, rec)
	assert.Assert(t, err != nil, "staged through a swapped link")
	assert.ErrorContains(t, err, "idmap staging: worktree "+wt)
	assert.Assert(t, !mounted())
	// The link's target alone (no link on the path) is open: refused too.
	assert.ErrorContains(t, c.stage(task.staging, filepath.Join(open, "wt"), rec), "other users can reach the worktree")
	assert.Assert(t, !mounted())

	assert.NilError(t, os.Remove(gate))
	assert.NilError(t, os.Rename(moved, gate))
	assert.NilError(t, c.stage(task.staging, wt, rec))
	assert.Assert(t, mounted(), "positive control: the gated worktree is staged")
	assert.NilError(t, c.Unstage(task))
}

// TestIdmapSubmountIsNotIdmapped: a filesystem mounted inside the worktree
// comes along in the staging (as the chown walks' rbind shows it) but is
// not idmapped: the agent writes the worktree's own files (the positive
// control) and not the owner's files on the submount, whose setuid bits
// and changes no give-back or scan would see (they stop at the worktree's
// filesystem).
func TestIdmapSubmountIsNotIdmapped(t *testing.T) {
	c, task, wt := idmapFixture(t)
	sub := filepath.Join(wt, "mnt")
	assert.NilError(t, os.Mkdir(sub, 0o755))
	assert.NilError(t, syscall.Mount("tmpfs", sub, "tmpfs", 0, "size=1m,mode=0755"))
	t.Cleanup(func() { _ = syscall.Unmount(sub, syscall.MNT_DETACH) })
	assert.NilError(t, os.Lchown(sub, idOwner, idOwner))
	assert.NilError(t, os.WriteFile(filepath.Join(sub, "g"), nil, 0o644))
	assert.NilError(t, os.Lchown(filepath.Join(sub, "g"), idOwner, idOwner))
	st := stageFixture(t, c, task, wt)

	out, err := asAgent(t, "cd "+st+" && echo b >> f && ls mnt/g")
	assert.NilError(t, err, "positive control: the worktree is the agent's and the submount is there: %s", out)
	out, err = asAgent(t, "cd "+st+"/mnt && { echo b >> g || exit 1; } && echo x > new && chmod 4755 new")
	assert.Assert(t, err != nil, "the agent wrote the owner's submount: %s", out)
	assert.Assert(t, strings.Contains(out, "Permission denied"), out)
	_, err = os.Lstat(filepath.Join(sub, "new"))
	assert.Assert(t, os.IsNotExist(err), "%v", err)
	assert.NilError(t, c.Unstage(task))
}
