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

func TestIPv4OnlyInternet(t *testing.T) {
	tb := New(t, IPv4OnlyInternet())
	out, err := tb.Exec("host", "sh", "-c", "echo tbv4-1 | busybox nc -w 2 "+InternetAddr4.String()+" 80")
	assert.NilError(t, err, string(out))
	assert.Equal(t, len(tb.Hits("tbv4-1")), 1, "positive control: the internet over IPv4")
	out, err = tb.Exec("internet", "ip", "-6", "addr", "show", "scope", "global")
	assert.NilError(t, err, string(out))
	assert.Equal(t, strings.TrimSpace(string(out)), "", "the internet has IPv6 addresses")
	out, err = tb.Exec("host", "ip", "route", "get", InternetAddr6.String())
	assert.Assert(t, err != nil && strings.Contains(string(out), "unreachable"), "the host routes IPv6 to the internet: %s", out)
	// The LAN keeps its IPv6.
	out, err = tb.Exec("host", "sh", "-c", "echo tbv4-2 | busybox nc -w 2 fd00:ec2::254 80")
	assert.NilError(t, err, string(out))
	assert.Equal(t, len(tb.Hits("tbv4-2")), 1)
}
