package probe

import (
	"context"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// TestParityComparesLikeWithLike: D14 compares, per check and protocol,
// only attempts the policy does not allow, and only where both families
// made some. The case of issue 29: an IPv4-only internet, where D9a's
// allowed IPv4 query reached and no check made an IPv6 attempt to compare
// it with, while D6 did try IPv6 (the LAN's ULA) — sealed, not escaped.
// Positive controls: a real asymmetry in either direction escapes.
func TestParityComparesLikeWithLike(t *testing.T) {
	run := func(by map[string][]Attempt) *Check {
		s := &netState{byCheck: by}
		c := &Check{ID: "D14"}
		s.parity(context.Background(), Params{}, c)
		return c
	}
	v4only := map[string][]Attempt{
		"D9a": {{Target: "dns:10.89.0.1:53", Reached: true, Allowed: true}},
		"D3":  {{Target: "tcp:10.89.0.1:22"}, {Target: "udp:10.89.0.1:123"}},
		"D6":  {{Target: "tcp:192.168.1.1:80"}, {Target: "tcp:fd00:1::1:80"}},
	}
	c := run(v4only)
	assert.Equal(t, c.Verdict, Sealed, "%s %v", c.Observed, c.Evidence)
	assert.Assert(t, strings.Contains(c.Observed, "1 check/protocol pairs"), c.Observed)

	// An allowed attempt over both families, reached only over IPv4 (the
	// internet has no IPv6): allowed attempts are not parity's business.
	c = run(map[string][]Attempt{"D9a": {
		{Target: "dns:10.89.0.1:53", Reached: true, Allowed: true},
		{Target: "dns:fd89::1:53", Allowed: true},
	}})
	assert.Equal(t, c.Verdict, Sealed, "%v", c.Evidence)

	for name, by := range map[string]map[string][]Attempt{
		"v6 through, v4 not": {"D6": {{Target: "tcp:192.168.1.1:80"}, {Target: "tcp:fd00:1::1:80", Reached: true}}},
		"v4 through, v6 not": {"D7": {{Target: "tcp:169.254.169.254:80", Reached: true}, {Target: "tcp:fd00:ec2::254:80"}}},
	} {
		c := run(by)
		assert.Equal(t, c.Verdict, Escaped, "%s: %v", name, c.Evidence)
	}
}
