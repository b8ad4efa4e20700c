package turn

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"net/netip"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/tbworld"
	"github.com/shrooms-cage/shrooms/internal/testbed"
	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/mounts"
	"github.com/shrooms-cage/shrooms/pkg/podman"
)

// newResolverEnv is a testbed world with a cage network under policy and
// a Runner whose resolver asks the testbed's DNS canary (an authoritative
// server for every name that logs each query).
func newResolverEnv(t *testing.T, policy string, allow []string, network map[string]any) (*tbworld.World, *Runner) {
	// The suites' runtime (SHROOMS_TEST_RUNTIME; the testbed's service
	// takes its flags), "default" without one.
	return newResolverEnvOn(t, cmp.Or(itest.CageRuntime(), "default"), nil, policy, allow, network)
}

// newResolverEnvOn is newResolverEnv with cage.runtime rt on a testbed
// service started with podman flags svc (the gVisor suite).
func newResolverEnvOn(t *testing.T, rt string, svc []string, policy string, allow []string, network map[string]any) (*tbworld.World, *Runner) {
	netw := map[string]any{"policy": policy, "allow": allow}
	for k, v := range network {
		netw[k] = v
	}
	e := tbworld.New(t, "rs", tbworld.WithService(svc...), tbworld.WithTestbedDNS(), tbworld.WithSeal(), tbworld.WithProbe(),
		tbworld.WithCage(map[string]any{"pids": 128, "nofile": 512, "nproc": 256, "timeout": "60s", "stop_grace": "1s", "runtime": rt}),
		tbworld.WithNetwork(netw))
	// The seal is verified, not re-applied, before each turn: an address a
	// name moves to after `net apply` is reachable only through the pins.
	r := NewRunner(e.Cfg, e.Client, func(ctx context.Context, cfg *config.Config, dry bool) (SealState, error) {
		st, err := firewall.Verify(ctx, cfg.Network, e.FW)
		if err != nil || !st.OK {
			return SealState{}, fmt.Errorf("seal: %v %s", err, st.Reason)
		}
		link, err := e.EnsureCageNetwork(ctx, cfg)
		if err != nil {
			return SealState{}, err
		}
		// The in-cage wall's rules, without the names resolved at apply:
		// what a cage reaches by name it reaches through the pins alone.
		rules, err := firewall.DescribeHost(cfg.Network, firewall.Resolved{}, e.FW)
		if err != nil {
			return SealState{}, err
		}
		return SealState{Digest: st.Installed, Rules: rules, Link: link}, firewall.PinBridgeMAC(cfg.Network.Bridge, e.FW)
	})
	r.Resolver = cagenet.Resolver(e.FW, e.TB.DialContext("host"))
	return e, r
}

type probeLine struct {
	Probe  string `json:"probe"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// run runs tbprobe with args in a fresh task's cage and returns its output.
func runProbe(t *testing.T, e *tbworld.World, r *Runner, args ...string) (string, *Result) {
	t.Helper()
	e.N++
	var out, errb bytes.Buffer
	res, err := r.Run(context.Background(), Request{
		Task: taskid.Must(fmt.Sprintf("%s-%d", e.Net, e.N)), Agent: "shell", Command: append([]string{"/tbprobe"}, args...),
		ExtraMounts: []mounts.Mount{{Kind: mounts.Bind, Source: e.Probe, Dest: "/tbprobe", ReadOnly: true, Options: []string{"rbind", "nosuid", "nodev"}}},
		Streams:     podman.Streams{Stdout: &out, Stderr: &errb},
	})
	assert.NilError(t, err, errb.String())
	if res.DNS != nil {
		t.Logf("resolver: %+v", *res.DNS)
	}
	return out.String(), res
}

func probes(t *testing.T, e *tbworld.World, r *Runner, args ...string) map[string]probeLine {
	t.Helper()
	out, _ := runProbe(t, e, r, args...)
	got := map[string]probeLine{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var p probeLine
		assert.NilError(t, json.Unmarshal([]byte(l), &p), out)
		got[p.Probe] = p
	}
	return got
}

// TestAllowlistResolverInTestbed is issue 29's allowlist-by-name
// acceptance: a name whose address moves after the seal was applied keeps
// working (its answer is pinned into the seal before the cage gets it, v4
// and v6), the same address is dropped when not resolved, a name not on
// the list gets no answer and never reaches the authoritative canary,
// direct DNS to any resolver (the canary, the gateway) is dropped, and
// 10 KiB encoded in query names reach the canary as 0 bytes.
func TestAllowlistResolverInTestbed(t *testing.T) {
	e, r := newResolverEnv(t, "allowlist", []string{"rot.allowed.test"}, nil)
	gw4, _, _ := firewall.Gateways(e.Cfg.Network)
	nonce := e.Net

	t.Run("unresolved, unlisted and direct DNS are dropped", func(t *testing.T) {
		got := probes(t, e, r,
			"tcp,"+testbed.Internet2Addr4.String()+",80,"+nonce+"-direct",
			"tcpname,"+nonce+"-unlisted.canary.test,80,"+nonce+"-unlisted",
			"dns,"+testbed.InternetAddr4.String()+",53,"+nonce+"-d4",
			"dnstcp,"+testbed.InternetAddr4.String()+",53,"+nonce+"-dt4",
			"dns,"+testbed.InternetAddr6.String()+",53,"+nonce+"-d6",
			"dns,"+gw4.String()+",53,"+nonce+"-gw",
		)
		for p, l := range got {
			assert.Check(t, !l.OK, "%s: SEAL BREACHED: %s", p, l.Detail)
		}
		assert.Check(t, strings.Contains(got["tcpname,"+nonce+"-unlisted.canary.test,80,"+nonce+"-unlisted"].Detail, "resolve"))
		time.Sleep(300 * time.Millisecond)
		for _, n := range []string{"-direct", "-unlisted", "-d4", "-dt4", "-d6", "-gw"} {
			assert.Check(t, len(e.TB.Hits(nonce+n)) == 0, "%s reached a canary: %v", n, e.TB.Hits(nonce+n))
		}
	})

	t.Run("a name that moves keeps working, pinned before the answer", func(t *testing.T) {
		for i, addr := range []netip.Addr{testbed.Internet2Addr4, testbed.Internet2Addr6, testbed.InternetAddr4} {
			e.TB.SetName("rot.allowed.test", addr)
			n := fmt.Sprintf("%s-rot%d", nonce, i)
			got := probes(t, e, r, "tcpname,rot.allowed.test,80,"+n)
			l := got["tcpname,rot.allowed.test,80,"+n]
			assert.Check(t, l.OK, "rotation %d to %s: %s", i, addr, l.Detail)
			missing := e.TB.AwaitHits(3*time.Second, n)
			assert.Check(t, len(missing) == 0, "the canary at %s did not see %s", addr, n)
			for _, h := range e.TB.Hits(n) {
				assert.Check(t, h.Local.Addr() == addr, "%s reached %s, not %s", n, h.Local, addr)
			}
			pins, err := firewall.Pinned(e.Cfg.Network, e.FW)
			assert.NilError(t, err)
			_, ok := pins[addr]
			assert.Check(t, ok, "%s is not pinned: %v", addr, pins)
		}
	})

	t.Run("10 KiB in query names: 0 bytes reach the canary", func(t *testing.T) {
		zone := nonce + "-x.canary.test"
		out, res := runProbe(t, e, r, "exfil", zone, "10240", "30")
		var r struct{ Sent, Answered int }
		assert.NilError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &r), out)
		assert.Equal(t, r.Sent, 92, "10 KiB in 112-byte names")
		assert.Equal(t, r.Answered, 0)
		time.Sleep(300 * time.Millisecond)
		assert.Equal(t, len(e.TB.Hits(zone)), 0, "DNS queries of the exfiltration reached the canary")
		assert.Assert(t, res.DNS != nil && res.DNS.Refused >= 92 && res.DNS.Upstream == 0, "%+v", res.DNS)
	})
}

// exfilReached runs tbprobe's exfil of n bytes for at most secs seconds
// in a cage and returns what the cage sent and the bytes of it the
// authoritative canary logged (112 per distinct name), with the seconds
// the cage spent.
func exfilReached(t *testing.T, e *tbworld.World, r *Runner, zone string, n, secs int) (sent, reached int, elapsed time.Duration) {
	t.Helper()
	out, _ := runProbe(t, e, r, "exfil", zone, fmt.Sprint(n), fmt.Sprint(secs))
	var got struct{ Sent, Answered, PerName, Ms int }
	assert.NilError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &got), out)
	time.Sleep(300 * time.Millisecond)
	seen := map[string]bool{}
	for _, h := range e.TB.Hits(zone) {
		if h.Proto == "dns" {
			seen[strings.SplitN(h.Payload, ".", 2)[0]] = true
		}
	}
	return got.Sent * got.PerName, len(seen) * got.PerName, time.Duration(got.Ms) * time.Millisecond
}

// TestInternetResolverInTestbed: under the internet policy the cage's
// resolver recurses for public names (the positive control), refuses an
// answer that points into the LAN (DNS rebinding), and its rate limit
// bounds what query names carry out; the figures (bytes a second reaching
// the testbed's authoritative canary, limited and unlimited) are the ones
// in docs/residual-risks.md.
func TestInternetResolverInTestbed(t *testing.T) {
	e, r := newResolverEnv(t, "internet", nil, nil)
	nonce := e.Net
	e.TB.SetName(nonce+"-lan.canary.test", testbed.RouterAddr4)
	got := probes(t, e, r, "tcpname,"+nonce+"-ok.canary.test,80,"+nonce+"-ok", "tcpname,"+nonce+"-lan.canary.test,80,"+nonce+"-lan")
	assert.Check(t, got["tcpname,"+nonce+"-ok.canary.test,80,"+nonce+"-ok"].OK, "a public name does not resolve: %+v", got)
	lan := got["tcpname,"+nonce+"-lan.canary.test,80,"+nonce+"-lan"]
	assert.Check(t, !lan.OK && strings.Contains(lan.Detail, "resolve"), "a name answering a LAN address was served: %+v", lan)
	assert.Check(t, len(e.TB.AwaitHits(3*time.Second, nonce+"-lan.canary.test")) == 0, "the rebinding name was asked upstream (the refusal is the resolver's, not a lost query)")

	const size, secs = 256 << 10, 10
	e.Cfg.Network.DNSRate, e.Cfg.Network.DNSBurst = 0, 1 // unlimited: the positive control
	sent0, reached0, el0 := exfilReached(t, e, r, nonce+"-u.canary.test", size, secs)
	e.Cfg.Network.DNSRate, e.Cfg.Network.DNSBurst = 20, 200 // the defaults
	sent1, reached1, el1 := exfilReached(t, e, r, nonce+"-l.canary.test", size, secs)
	rate := func(b int, d time.Duration) float64 { return float64(b) / d.Seconds() }
	t.Logf("unlimited: sent %d B, %d B reached the canary in %s (%.0f B/s)", sent0, reached0, el0, rate(reached0, el0))
	t.Logf("dns_rate 20, dns_burst 200: sent %d B, %d B reached the canary in %s (%.0f B/s)", sent1, reached1, el1, rate(reached1, el1))
	assert.Assert(t, reached0 > 20*reached1/10, "the limit should cut the channel well below the unlimited one")
	// One token per upstream query (the cage asks A and AAAA per name).
	bound := (200 + 20*el1.Seconds()) * 112
	assert.Assert(t, float64(reached1) <= bound, "%d B reached, more than the limit allows (%.0f)", reached1, bound)
}
