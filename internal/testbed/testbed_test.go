package testbed

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestTopology proves the testbed itself: it is isolated (New checks), its
// canaries log a hit with the nonce from a peer namespace (positive
// control), and a probe to an address outside it is refused by the kernel.
func TestTopology(t *testing.T) {
	itest.Require(t, itest.Root, itest.Netns, itest.Nftables)
	tb := New(t)
	out, err := tb.Exec("host", "sh", "-c", "echo tbnonce-1 | busybox nc -w 2 203.0.113.10 80")
	assert.NilError(t, err, string(out))
	assert.Assert(t, strings.Contains(string(out), "canary internet"), string(out))
	hits := tb.Hits("tbnonce-1")
	assert.Equal(t, len(hits), 1)
	assert.Equal(t, hits[0].NS, "internet")
	assert.Equal(t, hits[0].Local.Addr(), InternetAddr4)

	out, err = tb.Exec("host", "sh", "-c", "echo tbnonce-2 | busybox nc -w 2 fd00:ec2::254 80")
	assert.NilError(t, err, string(out))
	assert.Equal(t, len(tb.Hits("tbnonce-2")), 1)

	out, err = tb.Exec("internet", "busybox", "nc", "-w", "1", "8.8.8.8", "53")
	assert.Assert(t, err != nil, "internet namespace reached 8.8.8.8: %s", out)
	assert.Assert(t, strings.Contains(string(out), "unreachable"), string(out))
}
