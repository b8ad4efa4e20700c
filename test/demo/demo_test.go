// Package demo runs scripts/demo.sh (what `make demo` shows) against the
// test podman service and checks what it claims: turn 1 plants, turn 2
// finds nothing, and shrooms' report names what it dropped and masked.
package demo

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	itest.RemoveShroomsBinary()
	os.Exit(code)
}

func TestDemo(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman)
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	tmp := t.TempDir()
	cmd := exec.Command("bash", filepath.Join(root, "scripts", "demo.sh"))
	cmd.Env = append(os.Environ(), "SHROOMS_BIN="+itest.ShroomsBinary(t), "SHROOMS_DEMO_SOCKET="+itest.Socket(), "TMPDIR="+tmp)
	start := time.Now()
	b, err := cmd.CombinedOutput()
	out := string(b)
	assert.NilError(t, err, out)
	t.Logf("demo took %v", time.Since(start))

	// Turn 1 planted each thing (the positive control: the cage could write them).
	for _, p := range []string{"~/.claude/settings.json", "~/.claude.json", "~/.claude/CLAUDE.md", "~/.bashrc",
		"~/.config/opencode/plugin/evil.js", "/work/.opencode/plugin/evil.js", "/work/.mcp.json"} {
		assert.Check(t, is.Contains(out, "planted  "+p), p)
	}
	// The result of turn 1 flagged what it planted in the worktree.
	assert.Check(t, is.Contains(out, "worktree changes reported for turn 1: 4 added, 0 modified, 0 deleted; agent config: .mcp.json added, .opencode added"))
	// Turn 2 found none of it.
	assert.Check(t, !strings.Contains(out, "FOUND"), out)
	for _, line := range []string{
		"clean    /home/agent/.claude/settings.json (absent)",
		"clean    /home/agent/.claude/CLAUDE.md (absent)",
		"clean    /home/agent/.bashrc (absent)",
		"clean    /home/agent/.config/opencode/plugin/evil.js (absent)",
		"clean    /work/.opencode/plugin/evil.js (absent)",
		"clean    /work/.mcp.json (masked: {})",
		"clean    ~/.claude.json (kept, rebuilt without mcpServers)",
		// shrooms' own report of turn 2.
		"HOME reset: 4 paths removed: .bashrc, .claude/CLAUDE.md, .claude/settings.json, .config",
		"  dropped  .claude.json mcpServers: ",
		"worktree guard: masked in the cage: .mcp.json, .opencode",
		"status exited, exit 0",
	} {
		assert.Check(t, is.Contains(out, line))
	}
	// The owner still has the planted project files to review on the host.
	assert.Check(t, is.Contains(out, "evil.js"))
	// The demo cleaned up after itself (forget, then its directory).
	left, err := os.ReadDir(tmp)
	assert.NilError(t, err)
	assert.Check(t, len(left) == 0, "left behind: %v", left)
}
