package agents_test

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

// BenchmarkClaudeOneToolCallTurn: one Claude Code turn with one scripted
// Bash tool call, through `shrooms run` (seal check, HOME reset, managed
// policy, token secret, sealed cage) and as a bare `podman run --rm` of the
// same image on a fresh HOME. The difference is what shrooms costs a turn.
func BenchmarkClaudeOneToolCallTurn(b *testing.B) {
	itest.Require(b, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnv(b)
	script := func() { e.API.Append(bash("true"), modelapi.Text("done")) }
	args := []string{"-p", "--output-format", "json", "one tool call"}

	// One turn first, so both arms start with the image and the task warm.
	script()
	runTurn(e, "claude", args...)

	b.Run("shrooms-run", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			script()
			runTurn(e, "claude", args...)
		}
	})
	b.Run("podman-run", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			home, work := filepath.Join(b.TempDir(), "home"), e.Worktree
			assert.NilError(b, os.MkdirAll(home, 0o755))
			assert.NilError(b, os.Chown(home, 1000, 1000))
			script()
			b.StartTimer()
			bare(e, home, work, []string{"ANTHROPIC_BASE_URL=" + e.APIURL, "ANTHROPIC_API_KEY=" + apiKey,
				"DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"},
				append([]string{"claude", "--dangerously-skip-permissions"}, args...)...)
		}
	})
	assert.Equal(b, e.API.Overrun(), 0, "a turn did not follow its script:\n%s", e.API.Log())
}
