package firewall

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/testbed"
	"github.com/shrooms-cage/shrooms/pkg/config"
)

// cagePid is the host pid of a testbed cage's process.
func cagePid(t testing.TB, tb *testbed.Testbed, name string) int {
	t.Helper()
	out := strings.TrimSpace(tb.MustPodman("inspect", "-f", "{{.State.Pid}}", "stb"+tb.ID+"-"+name))
	pid, err := strconv.Atoi(out)
	assert.NilError(t, err, out)
	return pid
}

func wallOpts(t testing.TB, tb *testbed.Testbed, name string) Options {
	return Options{NetNS: "/proc/" + strconv.Itoa(cagePid(t, tb, name)) + "/ns/net"}
}

// judged marks each probe open as Check says for rules.
func judged(t testing.TB, r *Rules, ps []probe) []probe {
	t.Helper()
	out := make([]probe, len(ps))
	for i, p := range ps {
		proto := p.proto
		switch proto {
		case "dns":
			proto = "udp"
		case "dnstcp":
			proto = "tcp"
		}
		v, err := Check(r, Dest{Addr: p.addr, Proto: proto, Port: uint16(p.port)})
		assert.NilError(t, err)
		p.open = v.Allowed
		out[i] = p
	}
	return out
}

// TestCageWallInTestbed: the in-cage wall alone (host seal flushed) gives
// every probe of the seal battery the verdict the host seal alone gives,
// under internet and allowlist; the wall verifies, and tampering with it
// is seen; `net check`'s evaluator (Check) predicts what the cage reaches
// with both walls for every probe (≥ 20 destinations per policy).
func TestCageWallInTestbed(t *testing.T) {
	tb, cfg := newEnv(t)
	opts := hostOpts(tb)
	ctx := context.Background()
	wopts := wallOpts(t, tb, "a")
	allow := cfg
	allow.Policy = "allowlist"
	allow.Allow = []string{"2001:db8:203::10/128", "v4only.allowed.test"}
	aopts := opts
	aopts.Resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return tb.DialContext("host")(ctx, network, net.JoinHostPort(testbed.InternetAddr4.String(), "53"))
	}}
	t.Cleanup(func() {
		// The cage's namespace goes with the cage; its wall too.
		_ = Apply(context.Background(), cfg, opts)
	})

	for _, tc := range []struct {
		name string
		cfg  config.Network
		opts Options
	}{{"internet", cfg, opts}, {"allowlist", allow, aopts}} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := ApplyResolved(ctx, tc.cfg, tc.opts)
			assert.NilError(t, err)
			rules, err := DescribeHost(tc.cfg, res, tc.opts)
			assert.NilError(t, err)
			ps := judged(t, rules, battery(t, tb, cfg))
			open := 0
			for _, p := range ps {
				if p.open {
					open++
				}
			}
			assert.Assert(t, len(ps) >= 20 && open >= 2, "%d probes, %d open", len(ps), open)

			// Positive control: without either wall every probe lands.
			assert.NilError(t, Flush(ctx, tc.cfg, tc.opts))
			hit := fireControl(t, tb, "a", ps)
			for _, p := range ps {
				assert.Check(t, hit[p.name], "%s: no hit with neither wall: the test could not see a hole", p.name)
			}

			// The in-cage wall alone.
			st, err := ApplyWall(ctx, rules, wopts)
			assert.NilError(t, err)
			assert.Assert(t, st.OK, st.Reason)
			assert.Equal(t, st.Rules, rules.Digest())
			hit = fire(t, tb, "a", ps, allowed)
			for _, p := range ps {
				if p.open {
					assert.Check(t, hit[p.name], "%s: allowed, but the in-cage wall stopped it", p.name)
				} else {
					assert.Check(t, !hit[p.name], "%s: WALL BREACHED: the in-cage wall let it through", p.name)
				}
			}

			// Both walls: what net check says is what the cage reaches.
			_, err = ApplyResolved(ctx, tc.cfg, tc.opts)
			assert.NilError(t, err)
			hit = fire(t, tb, "a", ps, allowed)
			for _, p := range ps {
				assert.Check(t, hit[p.name] == p.open, "%s: net check says allowed=%v, the cage reached it: %v", p.name, p.open, hit[p.name])
			}

			// The wall's rules as nft shows them, and tampering seen.
			out, err := tb.Exec("host", "nsenter", "--net="+wopts.NetNS, "nft", "list", "table", "inet", WallTable)
			assert.NilError(t, err, string(out))
			assert.Assert(t, strings.Contains(string(out), "policy drop"), string(out))
			if tc.cfg.Policy == "allowlist" {
				assert.Assert(t, strings.Contains(string(out), "@names4 accept") && !strings.Contains(string(out), "meta nfproto ipv4 accept"), string(out))
			} else {
				assert.Assert(t, strings.Contains(string(out), "meta nfproto ipv4 accept"), string(out))
			}
			out, err = tb.Exec("host", "nsenter", "--net="+wopts.NetNS, "nft", "insert", "rule", "inet", WallTable, "output", "accept")
			assert.NilError(t, err, string(out))
			vs, err := VerifyWall(ctx, rules, wopts)
			assert.NilError(t, err)
			assert.Assert(t, !vs.OK && strings.Contains(vs.Reason, "differs"), "%+v", vs)
			out, err = tb.Exec("host", "nsenter", "--net="+wopts.NetNS, "nft", "delete", "table", "inet", WallTable)
			assert.NilError(t, err, string(out))
			vs, err = VerifyWall(ctx, rules, wopts)
			assert.NilError(t, err)
			assert.Assert(t, !vs.OK && strings.Contains(vs.Reason, "missing"), "%+v", vs)
		})
	}

	t.Run("policy none: loopback only", func(t *testing.T) {
		none := cfg
		none.Policy = "none"
		rules, err := Describe(none, Resolved{}, nil, nil)
		assert.NilError(t, err)
		st, err := ApplyWall(ctx, rules, wopts)
		assert.NilError(t, err)
		assert.Assert(t, st.OK, st.Reason)
		assert.NilError(t, Apply(ctx, cfg, opts))
		ps := []probe{{"internet under none", "tcp", testbed.InternetAddr4, 80, false, "tb"}}
		hit := fire(t, tb, "a", ps, all)
		assert.Check(t, !hit[ps[0].name], "policy none's wall let a packet out")
	})

	t.Run("refused without a namespace or rules", func(t *testing.T) {
		rules, err := Describe(cfg, Resolved{}, nil, nil)
		assert.NilError(t, err)
		_, err = ApplyWall(ctx, rules, Options{})
		assert.ErrorContains(t, err, "no cage network namespace")
		_, err = ApplyWall(ctx, nil, wopts)
		assert.ErrorContains(t, err, "no rule set")
		_, err = ApplyWall(ctx, rules, Options{NetNS: "/proc/999999999/ns/net"})
		assert.Assert(t, err != nil)
	})
}
