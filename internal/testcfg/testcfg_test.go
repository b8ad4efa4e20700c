package testcfg

import (
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
)

func TestBaseConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Socket: "unix:///run/x.sock", Dir: dir, Prefix: "p1"}.Parse(t, "t.toml")
	assert.Equal(t, cfg.Podman.Socket, "unix:///run/x.sock")
	assert.Equal(t, cfg.State.Dir, dir+"/state")
	assert.Equal(t, cfg.Outbox.Root, dir+"/outbox")
	assert.Equal(t, cfg.Cage.Image, itest.TestImage)
	assert.Equal(t, int64(cfg.Cage.Memory), int64(256<<20))
	assert.Equal(t, cfg.Cage.Timeout.Std(), 60*time.Second)
	assert.Equal(t, cfg.Cage.StopGrace.Std(), 2*time.Second)
	assert.Equal(t, cfg.Network.Policy, "none")
	assert.Equal(t, cfg.Home.VolumePrefix, "shrooms-home-p1-")
}

func TestOverridesAndDrops(t *testing.T) {
	c := Config{Socket: "unix:///run/x.sock", Dir: t.TempDir(), Prefix: "p2",
		Cage:    map[string]any{"pids": 128, "cpus": 1.0, "timeout": nil, "seccomp": "podman"},
		Network: map[string]any{"policy": "internet", "name": "n1", "bridge": "n1", "subnet4": "10.1.2.0/24", "subnet6": "fd89:5eed:1::/64"},
		Extra:   "[worktree]\nroots = [\"/srv\"]\n"}
	cfg := c.Parse(t, "t.toml")
	assert.Equal(t, cfg.Cage.Pids, int64(128))
	assert.Equal(t, cfg.Cage.CPUs, 1.0)
	assert.Equal(t, cfg.Cage.Seccomp, "podman")
	assert.Equal(t, cfg.Cage.Timeout.Std(), 2*time.Hour, "a dropped key keeps shrooms' default")
	assert.Equal(t, cfg.Network.Name, "n1")
	assert.DeepEqual(t, cfg.Worktree.Roots, []string{"/srv"})
}

// TestLabels: the cage labels itest.Env lists cages by are pkg/sealed's.
func TestLabels(t *testing.T) {
	assert.Equal(t, itest.LabelManaged, sealed.LabelManaged)
	assert.Equal(t, itest.LabelTask, sealed.LabelTask)
}
