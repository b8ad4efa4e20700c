package kube_test

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"

	"github.com/shrooms-cage/shrooms/pkg/kube"
)

// TestGatewaySidecarGetsTheAllowLists: gateway.NAME.allow_betas and
// allow_server_tools reach the sidecar's command line; without them it
// gets none (the gateway's built-in policy).
func TestGatewaySidecarGetsTheAllowLists(t *testing.T) {
	ph := strings.Repeat("p", 40)
	args := func(cfg string) []string {
		_, _, docs := build(t, cfg, kube.Input{Plain: true, Placeholder: ph})
		var pod corev1.Pod
		strict(t, docs[3], &pod)
		return pod.Spec.InitContainers[1].Args
	}
	plain := args(gatewayConfig)
	assert.Assert(t, !strings.Contains(strings.Join(plain, " "), "--allow-"), "%v", plain)
	allowed := args(strings.Replace(gatewayConfig, `token = "anthropic"`+"\n[agents", `token = "anthropic"`+"\nallow_betas = [\"mcp-client-2025-04-04\"]\nallow_server_tools = [\"web_search\", \"mcp_servers\"]\n[agents", 1))
	assert.DeepEqual(t, allowed[len(plain):], []string{"--allow-beta", "mcp-client-2025-04-04", "--allow-server-tool", "web_search", "--allow-server-tool", "mcp_servers"})
}
