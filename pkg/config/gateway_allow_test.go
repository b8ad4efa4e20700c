package config

import (
	"testing"

	"gotest.tools/v3/assert"
)

const gatewayBase = "[tokens]\nk = \"/run/k\"\n[gateway.anthropic]\nupstream = \"https://api.anthropic.com\"\ntoken = \"k\"\n"

// TestGatewayAllowLists: allow_betas and allow_server_tools are empty by
// default, strictly decoded, and each entry is checked with its key path.
func TestGatewayAllowLists(t *testing.T) {
	c, err := Parse("t.toml", []byte(gatewayBase))
	assert.NilError(t, err)
	g := c.Gateway["anthropic"]
	assert.Equal(t, len(g.AllowBetas)+len(g.AllowServerTools), 0, "nothing is allowed by default")

	c, err = Parse("t.toml", []byte(gatewayBase+"allow_betas = [\"mcp-client-2025-04-04\"]\nallow_server_tools = [\"web_search\", \"mcp_servers\"]\n"))
	assert.NilError(t, err)
	assert.DeepEqual(t, c.Gateway["anthropic"].AllowBetas, []string{"mcp-client-2025-04-04"})
	assert.DeepEqual(t, c.Gateway["anthropic"].AllowServerTools, []string{"web_search", "mcp_servers"})

	for extra, want := range map[string]string{
		"allow_betas = [\"ok\", \"Bad Beta\"]\n":     "gateway.anthropic.allow_betas[1]",
		"allow_betas = [\"\"]\n":                     "gateway.anthropic.allow_betas[0]",
		"allow_server_tools = [\"web_search,x\"]\n":  "gateway.anthropic.allow_server_tools[0]",
		"allow_server_tools = [\"a\", \"a\"]\n":      "gateway.anthropic.allow_server_tools[1]",
		"allow_server_tools = \"web_search\"\n":      "allow_server_tools",
		"allow_betas = [1]\n":                        "allow_betas",
		"allow_beta = [\"mcp-client-2025-04-04\"]\n": "allow_beta",
	} {
		_, err := Parse("t.toml", []byte(gatewayBase+extra))
		assert.ErrorContains(t, err, want, extra)
		assert.Assert(t, IsConfigError(err), extra)
	}
}

// TestGatewayHistory: the conversation pin is "refuse" by default; only
// refuse, report and off are accepted, the error naming the key.
func TestGatewayHistory(t *testing.T) {
	c, err := Parse("t.toml", []byte(gatewayBase))
	assert.NilError(t, err)
	assert.Equal(t, c.Gateway["anthropic"].History, "refuse")
	for _, mode := range []string{"refuse", "report", "off"} {
		c, err := Parse("t.toml", []byte(gatewayBase+"history = \""+mode+"\"\n"))
		assert.NilError(t, err)
		assert.Equal(t, c.Gateway["anthropic"].History, mode)
	}
	_, err = Parse("t.toml", []byte(gatewayBase+"history = \"warn\"\n"))
	assert.ErrorContains(t, err, "gateway.anthropic.history")
}
