package home

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// TestPlanPolicyThenWrite: planning writes nothing; Write puts exactly the
// planned bytes (their digests) where the mounts say, world-readable; the
// gateway's base URL is pinned in opencode's policy.
func TestPlanPolicyThenWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "policy")
	pol, err := PlanPolicy(dir, config.Default(), []string{"shell", "opencode", "claude"}, PolicyGateway{AnthropicBaseURL: "http://127.0.0.1:1"})
	assert.NilError(t, err)
	_, err = os.Stat(dir)
	assert.Assert(t, os.IsNotExist(err), "planning wrote %s", dir)
	assert.Equal(t, len(pol.Mounts), 2)
	assert.Equal(t, pol.Mounts[0].Dest, "/etc/opencode")
	assert.Equal(t, pol.Mounts[1].Source, filepath.Join(dir, "claude-code"))

	assert.NilError(t, pol.Write())
	for _, m := range pol.Mounts {
		for name, digest := range m.Files {
			b, err := os.ReadFile(filepath.Join(m.Source, name))
			assert.NilError(t, err)
			sum := sha256.Sum256(b)
			assert.Equal(t, "sha256:"+hex.EncodeToString(sum[:]), digest, name)
			fi, err := os.Stat(filepath.Join(m.Source, name))
			assert.NilError(t, err)
			assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o644))
		}
	}
	oc, err := os.ReadFile(filepath.Join(dir, "opencode", "opencode.json"))
	assert.NilError(t, err)
	assert.Assert(t, strings.Contains(string(oc), `"baseURL": "http://127.0.0.1:1/v1"`), string(oc))

	_, err = PlanPolicy("relative", config.Default(), []string{"claude"}, PolicyGateway{})
	assert.ErrorContains(t, err, "must be absolute")
	_, err = PlanPolicy(dir, config.Default(), []string{"zsh"}, PolicyGateway{})
	assert.ErrorContains(t, err, `unknown HOME profile "zsh"`)
}

// TestPlanPolicyCodex: Codex's managed config pins notify off and, with a
// gateway, the provider; its requirements turn hooks off and allow no MCP
// server; an owner key that would change an enforced one is refused.
func TestPlanPolicyCodex(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "policy")
	cfg := config.Default()
	cfg.Home.Profile("codex").Managed = map[string]any{"model": "gpt-x"}
	pol, err := PlanPolicy(dir, cfg, []string{"codex", "shell"}, PolicyGateway{OpenAIBaseURL: "http://127.0.0.1:1"})
	assert.NilError(t, err)
	assert.Equal(t, len(pol.Mounts), 1)
	assert.Equal(t, pol.Mounts[0].Dest, "/etc/codex")
	assert.NilError(t, pol.Write())
	var managed, req map[string]any
	_, err = toml.DecodeFile(filepath.Join(dir, "codex", "managed_config.toml"), &managed)
	assert.NilError(t, err)
	_, err = toml.DecodeFile(filepath.Join(dir, "codex", "requirements.toml"), &req)
	assert.NilError(t, err)
	assert.DeepEqual(t, managed["notify"], []any{})
	assert.Equal(t, managed["model"], "gpt-x")
	assert.Equal(t, managed["model_provider"], "shrooms")
	prov := managed["model_providers"].(map[string]any)["shrooms"].(map[string]any)
	assert.Equal(t, prov["base_url"], "http://127.0.0.1:1/v1")
	assert.Equal(t, prov["env_key"], "OPENAI_API_KEY")
	assert.Equal(t, prov["supports_websockets"], false)
	assert.DeepEqual(t, req, map[string]any{"features": map[string]any{"hooks": false}, "mcp_servers": map[string]any{}})

	pol, err = PlanPolicy(dir, config.Default(), []string{"codex"}, PolicyGateway{})
	assert.NilError(t, err)
	assert.NilError(t, pol.Write())
	managed = nil
	_, err = toml.DecodeFile(filepath.Join(dir, "codex", "managed_config.toml"), &managed)
	assert.NilError(t, err)
	_, pinned := managed["model_provider"]
	assert.Assert(t, !pinned, "no gateway, no provider pinned")

	cfg.Home.Profile("codex").Managed = map[string]any{"notify": []any{"sh", "-c", "x"}}
	_, err = PlanPolicy(dir, cfg, []string{"codex"}, PolicyGateway{})
	assert.ErrorContains(t, err, "home.codex.managed.notify")
}

// TestPlanPolicyClaude: Claude Code's managed settings and MCP file, and an
// owner key that would change an enforced one refused as a config error.
func TestPlanPolicyClaude(t *testing.T) {
	cfg := config.Default()
	dir := t.TempDir()
	pol, err := PlanPolicy(dir, cfg, []string{"claude", "opencode", "shell"}, PolicyGateway{})
	assert.NilError(t, err)
	mounts := pol.Mounts
	assert.Equal(t, len(mounts), 2)
	_, err = os.Stat(mounts[0].Source)
	assert.Assert(t, os.IsNotExist(err), "planning writes nothing")
	assert.NilError(t, pol.Write())
	assert.Equal(t, mounts[0].Dest, "/etc/claude-code")
	var ms map[string]any
	data, err := os.ReadFile(filepath.Join(mounts[0].Source, "managed-settings.json"))
	assert.NilError(t, err)
	assert.NilError(t, json.Unmarshal(data, &ms))
	assert.Equal(t, ms["allowManagedHooksOnly"], true)
	data, _ = os.ReadFile(filepath.Join(mounts[0].Source, "managed-mcp.json"))
	assert.Equal(t, string(data), "{\n  \"mcpServers\": {}\n}\n")
	cfg.Home.Profile("claude").Managed = map[string]any{"allowManagedHooksOnly": false}
	_, err = PlanPolicy(dir, cfg, []string{"claude"}, PolicyGateway{})
	assert.Assert(t, config.IsConfigError(err))
	assert.ErrorContains(t, err, "home.claude.managed.allowManagedHooksOnly: is enforced by shrooms")
}
