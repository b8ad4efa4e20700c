package gitseal

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/mounts"
)

// treeDigest hashes every file (path, mode, content) under dir.
func treeDigest(t *testing.T, dir string) string {
	h := sha256.New()
	assert.NilError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h.Write([]byte(p + "\x00" + fi.Mode().String() + "\x00"))
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	}))
	return hex.EncodeToString(h.Sum(nil))
}

// runCage runs script in a busybox cage as root with podman's default
// capabilities (the strongest DAC attacker), the worktree at /work and the
// git mounts of PlanCage after it, and returns the output.
func runCage(t *testing.T, wt string, ms []mounts.Mount, script string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	name := itest.UniqueName("shrooms-gitseal-")
	args := []string{"--url", itest.Socket(), "run", "--rm", "--name", name, "--network", "none", "--user", "0:0",
		"-v", wt + ":/work:rw"}
	for _, m := range ms {
		assert.Equal(t, m.Kind, mounts.Bind)
		assert.Assert(t, m.ReadOnly, "git metadata mount %s must be read-only", m.Dest)
		args = append(args, "-v", m.Source+":"+m.Dest+":ro,nosuid,nodev,noexec")
	}
	args = append(args, itest.TestImage, "sh", "-c", script)
	t.Cleanup(func() { _ = exec.Command("podman", "--url", itest.Socket(), "rm", "-f", "-i", name).Run() })
	out, err := exec.CommandContext(ctx, "podman", args...).CombinedOutput()
	t.Logf("cage:\n%s", out)
	assert.NilError(t, err)
	return string(out)
}

const probeFn = `probe() { if sh -c "$2" 2>/dev/null; then echo "$1=WROTE"; else echo "$1=DENIED"; fi; }
`

func assertProbes(t *testing.T, out string, denied []string, allowed []string) {
	for _, p := range denied {
		assert.Assert(t, is.Contains(out, p+"=DENIED"), "write to %s must fail", p)
	}
	for _, p := range allowed {
		assert.Assert(t, is.Contains(out, p+"=WROTE"), "positive control %s must succeed", p)
	}
}

func TestCageGitMetadataReadOnlyPlainClone(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman)
	wt := newRepo(t)
	pl, err := PlanCage(wt, t.TempDir())
	assert.NilError(t, err)
	assert.NilError(t, pl.Write())
	ms := pl.Mounts
	assert.DeepEqual(t, ms, []mounts.Mount{{Kind: mounts.Bind, Source: filepath.Join(wt, ".git"), Dest: "/work/.git", ReadOnly: true, Options: []string{"bind", "nosuid", "nodev", "noexec"}}})
	before := treeDigest(t, filepath.Join(wt, ".git"))
	out := runCage(t, wt, ms, probeFn+`
probe config 'echo "[core]" >> /work/.git/config'
probe hooks 'echo x > /work/.git/hooks/pre-commit'
probe refs 'echo x > /work/.git/refs/heads/main'
probe newref 'echo x > /work/.git/refs/heads/evil'
probe index 'echo x > /work/.git/index'
probe attributes 'echo "* filter=x" >> /work/.git/info/attributes'
probe objects 'touch /work/.git/objects/x'
probe head 'echo x > /work/.git/HEAD'
probe chmod 'chmod 777 /work/.git/config'
probe rm 'rm -rf /work/.git'
probe mv 'mv /work/.git /work/g2'
probe newfile 'echo y > /work/newfile'
probe readhead 'grep -q refs/heads/main /work/.git/HEAD'
`)
	assertProbes(t, out, []string{"config", "hooks", "refs", "newref", "index", "attributes", "objects", "head", "chmod", "rm", "mv"}, []string{"newfile", "readhead"})
	assert.Equal(t, treeDigest(t, filepath.Join(wt, ".git")), before, ".git changed on the host")
}

func TestCageGitMetadataReadOnlyLinkedWorktree(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman)
	main := newRepo(t)
	wt := filepath.Join(t.TempDir(), "wt1")
	hostGit(t, main, "worktree", "add", "-q", "-b", "task1", wt)
	state := t.TempDir()
	pl, err := PlanCage(wt, state)
	assert.NilError(t, err)
	_, err = os.Stat(pl.Pointer.Path)
	assert.Assert(t, os.IsNotExist(err), "planning writes nothing")
	assert.NilError(t, pl.Write())
	ms := pl.Mounts
	assert.Equal(t, len(ms), 2)
	assert.Equal(t, ms[0].Source, filepath.Join(main, ".git"))
	assert.Equal(t, ms[0].Dest, CageCommonDir)
	assert.Equal(t, ms[1].Dest, "/work/.git")
	assert.Assert(t, strings.HasPrefix(ms[1].Source, state+"/gitseal/"))
	b, err := os.ReadFile(ms[1].Source)
	assert.NilError(t, err)
	assert.Equal(t, string(b), "gitdir: /git-common/worktrees/wt1\n")

	beforeCommon := treeDigest(t, filepath.Join(main, ".git"))
	dotgit, err := os.ReadFile(filepath.Join(wt, ".git"))
	assert.NilError(t, err)
	out := runCage(t, wt, ms, probeFn+`
probe gitdirptr 'echo "gitdir: /tmp" > /work/.git'
probe rmdotgit 'rm -f /work/.git'
probe mvdotgit 'mv /work/.git /work/g2'
probe config 'echo "[core]" >> /git-common/config'
probe hooks 'echo x > /git-common/hooks/pre-commit'
probe refs 'echo x > /git-common/refs/heads/task1'
probe attributes 'echo "* filter=x" >> /git-common/info/attributes'
probe wtindex 'echo x > /git-common/worktrees/wt1/index'
probe wthead 'echo x > /git-common/worktrees/wt1/HEAD'
probe backptr 'echo /tmp/.git > /git-common/worktrees/wt1/gitdir'
probe commondir 'echo /tmp > /git-common/worktrees/wt1/commondir'
probe wtconfig 'echo "[core]" > /git-common/worktrees/wt1/config.worktree'
probe newfile 'echo y > /work/newfile'
probe readptr 'grep -qx "gitdir: /git-common/worktrees/wt1" /work/.git'
probe readhead 'grep -q refs/heads/task1 /git-common/worktrees/wt1/HEAD && grep -qx ../.. /git-common/worktrees/wt1/commondir'
`)
	assertProbes(t, out, []string{"gitdirptr", "rmdotgit", "mvdotgit", "config", "hooks", "refs", "attributes", "wtindex", "wthead", "backptr", "commondir", "wtconfig"}, []string{"newfile", "readptr", "readhead"})
	assert.Equal(t, treeDigest(t, filepath.Join(main, ".git")), beforeCommon, "common dir changed on the host")
	after, err := os.ReadFile(filepath.Join(wt, ".git"))
	assert.NilError(t, err)
	assert.Equal(t, string(after), string(dotgit), "the host's .git pointer changed")
	// The turn's work commits on the host.
	id, err := Commit(context.Background(), wt, "turn", author)
	assert.NilError(t, err)
	assert.Equal(t, hostGitRaw(t, main, "show", id+":newfile"), "y\n")
}
