package firewall

import (
	"os/exec"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestForwardDrops: a forward base chain of another table whose policy
// drops is named (doctor warns: the shrooms driver's cages would reach
// nothing); one that accepts what comes in on the bridge, the seal's own
// table and a bridge-family chain are not.
func TestForwardDrops(t *testing.T) {
	itest.Require(t, itest.Root, itest.Nftables, itest.Netns)
	ns := itest.UniqueName("stbfd")
	out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput()
	assert.NilError(t, err, string(out))
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	opts := Options{NetNS: "/run/netns/" + ns}
	nft := func(script string) {
		t.Helper()
		cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		out, err := cmd.CombinedOutput()
		assert.NilError(t, err, string(out))
	}
	drops, err := ForwardDrops(opts, "cn", "cbr0")
	assert.NilError(t, err)
	assert.Equal(t, len(drops), 0, "an empty ruleset: %v", drops)

	nft(`table ip filter {
	chain FORWARD {
		type filter hook forward priority 0; policy drop;
	}
}
table inet shrooms_cn {
	chain forward {
		type filter hook forward priority 0; policy drop;
	}
}
table bridge br {
	chain forward {
		type filter hook forward priority 0; policy drop;
	}
}
table inet ok {
	chain fw1 {
		type filter hook forward priority 0; policy accept;
	}
}
`)
	drops, err = ForwardDrops(opts, "cn", "cbr0")
	assert.NilError(t, err)
	assert.DeepEqual(t, drops, []string{"table ip filter chain FORWARD"})

	// An accept of the bridge's traffic there (as the NixOS module adds).
	nft(`add rule ip filter FORWARD iifname "cbr0" ip saddr 10.89.0.0/24 accept`)
	drops, err = ForwardDrops(opts, "cn", "cbr0")
	assert.NilError(t, err)
	assert.Equal(t, len(drops), 0, "%v", drops)
	// Another bridge's accept does not count.
	drops, err = ForwardDrops(opts, "cn", "other0")
	assert.NilError(t, err)
	assert.DeepEqual(t, drops, []string{"table ip filter chain FORWARD"})
}
