package probe_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/tbworld"
	"github.com/shrooms-cage/shrooms/internal/testbed"
	"github.com/shrooms-cage/shrooms/pkg/cagelink"
	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/mounts"
	// The battery's names unqualified: these tests drive it from the host
	// (probedrive), which imports it.
	. "github.com/shrooms-cage/shrooms/pkg/probe"
	"github.com/shrooms-cage/shrooms/pkg/probedrive"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// sealState is the state a seal check reports for a verified seal: its
// digest and the rule set (the in-cage wall is built from it).
func sealState(e *tbworld.World, cfg *config.Config, st firewall.Status) (turn.SealState, error) {
	rules, err := firewall.DescribeHost(cfg.Network, firewall.Resolved{}, e.FW)
	if err != nil {
		return turn.SealState{}, err
	}
	// The cage network as the driver makes it (the shrooms driver's link
	// rides on the seal state).
	link, err := e.EnsureCageNetwork(context.Background(), cfg)
	if err != nil {
		return turn.SealState{}, err
	}
	return turn.SealState{Digest: st.Installed, Rules: rules, Link: link}, nil
}

// noWall is a CageWaller that installs nothing: with it a cage runs behind
// the host seal alone, as before the in-cage wall (positive controls).
func noWall(context.Context, turn.SealState, int, bool) (firewall.WallStatus, error) {
	return firewall.WallStatus{}, nil
}

// newTBEnv is the battery's world in the testbed: the default config
// (policy internet, seccomp "shrooms") on a cage network of the testbed's
// podman, the seal in the testbed's host namespace, a peer cage running a
// canary, discovery responders on the bridge and routes to the cage
// subnets (so the LAN and the internet could open connections into a
// cage, D15).
func newTBEnv(t *testing.T, opts ...testbed.Option) *tbworld.World {
	t.Helper()
	e := tbworld.New(t, "pt", tbworld.WithTestbed(opts...), tbworld.WithPeer(),
		tbworld.WithCage(map[string]any{"pids": 128, "nofile": 512, "nproc": 256, "timeout": "90s"}))
	assert.Equal(t, e.Cfg.Cage.Seccomp, "shrooms", "the default config's seccomp profile")
	return e
}

// battery varies one run of the battery.
type battery struct {
	// discover replaces the host, LAN and metadata targets with what
	// Discover finds.
	discover bool
	// noWall turns the in-cage wall off (negative controls only).
	noWall bool
	// v4Internet: the testbed's internet has no IPv6 (targets v4 only).
	v4Internet bool
}

// params are the testbed's addresses as `shrooms probe --targets` takes them.
func targets(e *tbworld.World, b battery, nonce string) Params {
	gw4, gw6, _ := firewall.Gateways(e.Cfg.Network)
	s := func(as ...netip.Addr) []string {
		var out []string
		for _, a := range as {
			out = append(out, a.String())
		}
		return out
	}
	internet := s(testbed.InternetAddr4, testbed.InternetAddr6)
	if b.v4Internet {
		internet = s(testbed.InternetAddr4)
	}
	return Params{
		Policy:        e.Cfg.Network.Policy,
		StrictSeccomp: e.Cfg.Cage.StrictSeccomp(),
		Internet:      internet,
		Gateway:       s(gw4, gw6),
		Host:          s(testbed.HostAddr4, testbed.HostAddr6),
		LAN: s(append([]netip.Addr{testbed.RouterAddr4, testbed.RouterAddr6, testbed.PublicLAN4, testbed.PublicLAN6,
			testbed.VPN4, testbed.VPN6}, testbed.Private...)...),
		Metadata:      s(testbed.Metadata4, testbed.Metadata6, testbed.WireServer),
		Peers:         e.Peer,
		Resolvers:     internet,
		TCPPorts:      testbed.TCPPorts,
		UDPPorts:      testbed.UDPPorts,
		DNSZone:       "canary.test",
		Nonce:         nonce,
		Multicast:     true,
		InboundPort:   18080,
		InboundWaitMs: 5000,
	}
}

// inbound is what the host side saw when it tried to connect into the cage.
type inbound struct {
	mu        sync.Mutex
	tried     []string
	connected []string
}

// runBattery runs the battery once with seal checker seal, tries to
// connect into the cage from the host, router and internet namespaces
// while it runs (D15), and joins the report with the canary logs; it
// returns the targets it gave the battery (what Discover found, with
// b.discover).
func runBattery(t *testing.T, e *tbworld.World, seal turn.SealChecker, b battery) (*Report, *inbound, Params) {
	t.Helper()
	e.N++
	nonce := fmt.Sprintf("%s-%d", e.Prefix, e.N)
	r := turn.NewRunner(e.Cfg, e.Client, seal)
	r.Resolver = cagenet.Resolver(e.FW, e.TB.DialContext("host"))
	if b.noWall {
		r.CageWall = noWall
	}
	in := &inbound{}
	var stderr strings.Builder
	var mu sync.Mutex
	params := targets(e, b, nonce)
	if b.discover {
		params.Host, params.LAN, params.Metadata, params.Peers = nil, nil, nil, nil
		assert.NilError(t, probedrive.Discover(&params, e.Cfg.Network, e.FW))
	}
	rep, res, err := probedrive.Run(context.Background(), r, probedrive.Options{
		Task: taskid.Must(fmt.Sprintf("%s-%d", e.Prefix, e.N)), Agent: "shell", Binary: shroomsBinary(t),
		Params: params, Timeout: 90 * time.Second, Peer: b.discover,
		Stderr: writerFunc(func(p []byte) { mu.Lock(); stderr.Write(p); mu.Unlock() }),
		OnInbound: func(addr string, port int) {
			var wg sync.WaitGroup
			for _, role := range []string{"host", "router", "internet"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					target := role + "->" + net.JoinHostPort(addr, strconv.Itoa(port))
					ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
					defer cancel()
					c, err := e.TB.DialContext(role)(ctx, "tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
					in.mu.Lock()
					in.tried = append(in.tried, target)
					if err == nil {
						in.connected = append(in.connected, target)
					}
					in.mu.Unlock()
					if err == nil {
						fmt.Fprintf(c, "%s-inbound-%s\n", nonce, role)
						c.Close()
					}
				}()
			}
			wg.Wait()
		},
	})
	mu.Lock()
	assert.NilError(t, err, stderr.String())
	mu.Unlock()
	assert.Assert(t, res.Removed, "cage not removed: %s", res.Error)

	// Attempts the prober saw answered, or the policy allows, must show in
	// the canary logs; wait for those (logging is asynchronous), then join.
	var await []string
	for _, c := range rep.Checks {
		for _, a := range c.Nonces {
			if (a.Reached || a.Allowed) && !strings.Contains(a.Target, ":443") && !strings.Contains(a.Target, ":853") {
				await = append(await, a.Nonce)
			}
		}
	}
	missing := e.TB.AwaitHits(3*time.Second, await...)
	peerLog := e.TB.MustPodman("logs", e.Net+"-peer")
	Join(rep, func(n string) bool {
		return len(e.TB.Hits(n)) > 0 || strings.Contains(peerLog, n+"\n")
	})
	if t.Failed() || testing.Verbose() {
		t.Logf("attempts without a canary hit (some are answered by a reset, not a canary): %v", missing)
		t.Logf("inbound tried %v, connected %v", in.tried, in.connected)
		for _, c := range rep.Checks {
			if c.Verdict != Sealed {
				t.Logf("%s %s: %s %s %v", c.ID, c.Verdict, c.Observed, c.Reason, c.Evidence)
			}
		}
	}
	return rep, in, params
}

type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

// TestBatteryInTestbed is issue 5's acceptance in the testbed: under the
// default config every check runs, none escapes or errs, and the residual
// rows are exactly the documented ones (docs/residual-risks.md); nothing
// can open a connection into the cage. Then the negative control: with the
// seal flushed the same battery flips exactly the rows the seal guards to
// escaped, judged by the canaries (Join), not only by the prober.
func TestBatteryInTestbed(t *testing.T) {
	e := newTBEnv(t)
	ctx := context.Background()
	verified := func(ctx context.Context, cfg *config.Config, _ bool) (turn.SealState, error) {
		st, err := firewall.Verify(ctx, cfg.Network, e.FW)
		if err != nil {
			return turn.SealState{}, err
		}
		if !st.OK {
			return turn.SealState{}, fmt.Errorf("%s", st.Reason)
		}
		return sealState(e, cfg, st)
	}

	t.Run("sealed, default config", func(t *testing.T) {
		rep, in, _ := runBattery(t, e, verified, battery{})
		assert.Assert(t, len(rep.Checks) >= 40, "%d checks", len(rep.Checks))
		assert.DeepEqual(t, rep.IDs(Escaped), []string(nil))
		assert.DeepEqual(t, rep.IDs(Error), []string(nil))
		assert.DeepEqual(t, rep.IDs(Residual), sorted("A4", "B10", "D9d", "D9e"))
		// Both walls were in place and built from one rule set.
		assert.Assert(t, rep.Walls != nil && rep.Walls.Agree, "%+v", rep.Walls)
		// D2 and D9a are the positive controls: the canaries saw them.
		for _, id := range []string{"D2", "D9a"} {
			for _, a := range attempts(rep, id) {
				assert.Check(t, a.Canary != nil && *a.Canary, "%s %s: allowed attempt not seen by its canary", id, a.Target)
			}
		}
		assert.Equal(t, len(in.tried), 6, "inbound attempts: %v (3 namespaces x v4, v6)", in.tried)
		assert.DeepEqual(t, in.connected, []string(nil))
	})

	t.Run("seal flushed: exactly the sealed network rows escape", func(t *testing.T) {
		assert.NilError(t, firewall.Flush(ctx, e.Cfg.Network, e.FW))
		defer func() { assert.NilError(t, firewall.Apply(ctx, e.Cfg.Network, e.FW)) }()
		// A seal checker that lets the turn start without a seal: only for
		// this negative control. shrooms itself refuses here (the seal is
		// missing), which TestNetworkedTurnInTestbed in cmd/shrooms covers.
		permissive := func(ctx context.Context, cfg *config.Config, _ bool) (turn.SealState, error) {
			link, err := e.EnsureCageNetwork(ctx, cfg) // the cage is linked all the same
			return turn.SealState{Link: link}, err
		}
		_, err := verified(ctx, e.Cfg, false)
		assert.ErrorContains(t, err, "missing", "the real checker refuses a flushed seal")
		// And the in-cage wall off: with it the flushed host seal lets
		// nothing through (TestCageWallHoldsWithoutHostSeal).
		rep, in, _ := runBattery(t, e, permissive, battery{noWall: true})
		// Not D5: its ICMPv6 echo needs an unprivileged ICMP socket, and
		// podman's net.ipv4.ping_group_range ("0 0") denies the agent one,
		// so in a shrooms cage it cannot send at all, seal or not.
		assert.DeepEqual(t, rep.IDs(Escaped), sorted("D3", "D4", "D6", "D7", "D8", "D9b", "D9c", "D9f", "D13", "D15"))
		assert.DeepEqual(t, rep.IDs(Error), []string(nil))
		// Judged by the receiving side: each flipped row with tagged
		// attempts has one its canary logged (D15's witness is the cage's
		// own listener, and the host side's connects above).
		for _, id := range []string{"D3", "D4", "D6", "D7", "D8", "D9b", "D9f", "D13"} {
			seen := 0
			for _, a := range attempts(rep, id) {
				if a.Canary != nil && *a.Canary {
					seen++
				}
			}
			assert.Check(t, seen > 0, "%s escaped, but no canary logged any of its attempts", id)
		}
		assert.Equal(t, len(in.connected), 6, "with the seal flushed the host, LAN and internet connect into the cage: %v", in.connected)
	})
}

// TestBatteryIPv4OnlyInternet is D14 on an IPv4-only internet (issue 29):
// the internet and its resolvers have no IPv6, the LAN and the cage
// network still do. No check escapes or errs — D14 compares like with like
// — and the positive controls (D2, D9a) reach their canaries over IPv4.
func TestBatteryIPv4OnlyInternet(t *testing.T) {
	e := newTBEnv(t, testbed.IPv4OnlyInternet())
	verified := func(ctx context.Context, cfg *config.Config, _ bool) (turn.SealState, error) {
		st, err := firewall.Verify(ctx, cfg.Network, e.FW)
		if err != nil {
			return turn.SealState{}, err
		}
		if !st.OK {
			return turn.SealState{}, fmt.Errorf("%s", st.Reason)
		}
		return sealState(e, cfg, st)
	}
	rep, _, _ := runBattery(t, e, verified, battery{v4Internet: true})
	assert.DeepEqual(t, rep.IDs(Escaped), []string(nil))
	assert.DeepEqual(t, rep.IDs(Error), []string(nil))
	for _, c := range rep.Checks {
		if c.ID == "D14" {
			assert.Equal(t, c.Verdict, Sealed, "%s %v", c.Observed, c.Evidence)
			t.Logf("D14: %s", c.Observed)
		}
	}
	for _, id := range []string{"D2", "D9a"} {
		seen := 0
		for _, a := range attempts(rep, id) {
			if a.Canary != nil && *a.Canary {
				seen++
			}
		}
		assert.Check(t, seen > 0, "%s: no allowed attempt reached its canary", id)
	}
}

// TestBatteryWithDiscoveredTargets: the host, LAN and metadata rows aimed
// at what Discover finds in the testbed's host namespace instead of a
// targets file, and D8 at a peer cage the probe starts itself: sealed,
// they hold without errors; with the seal flushed, they flip to escaped
// (the discovered targets and the peer are real ones).
func TestBatteryWithDiscoveredTargets(t *testing.T) {
	e := newTBEnv(t)
	ctx := context.Background()
	verified := func(ctx context.Context, cfg *config.Config, _ bool) (turn.SealState, error) {
		st, err := firewall.Verify(ctx, cfg.Network, e.FW)
		if err != nil {
			return turn.SealState{}, err
		}
		if !st.OK {
			return turn.SealState{}, fmt.Errorf("%s", st.Reason)
		}
		return sealState(e, cfg, st)
	}
	rep, _, d := runBattery(t, e, verified, battery{discover: true})
	t.Logf("discovered: host %v lan %v metadata %v", d.Host, d.LAN, d.Metadata)
	for _, want := range []netip.Addr{testbed.HostAddr4, testbed.HostAddr6, testbed.HostPublicLAN4} {
		assert.Check(t, slices.Contains(d.Host, want.String()), "host address %s not discovered: %v", want, d.Host)
	}
	for _, want := range []netip.Addr{testbed.RouterAddr4, testbed.RouterAddr6, testbed.PublicLAN4, testbed.PublicLAN6, netip.MustParseAddr("10.200.0.1"), testbed.Metadata4} {
		assert.Check(t, slices.Contains(d.LAN, want.String()), "LAN target %s not discovered: %v", want, d.LAN)
	}
	assert.Check(t, slices.Contains(d.Metadata, testbed.WireServer.String()))
	assert.DeepEqual(t, rep.IDs(Escaped), []string(nil))
	assert.DeepEqual(t, rep.IDs(Error), []string(nil))

	assert.NilError(t, firewall.Flush(ctx, e.Cfg.Network, e.FW))
	defer func() { assert.NilError(t, firewall.Apply(ctx, e.Cfg.Network, e.FW)) }()
	permissive := func(ctx context.Context, cfg *config.Config, _ bool) (turn.SealState, error) {
		link, err := e.EnsureCageNetwork(ctx, cfg) // the cage is linked all the same
		return turn.SealState{Link: link}, err
	}
	rep, _, _ = runBattery(t, e, permissive, battery{discover: true, noWall: true})
	escaped := rep.IDs(Escaped)
	for _, id := range []string{"D4", "D6", "D7", "D8"} {
		assert.Check(t, slices.Contains(escaped, id), "%s does not flip with the seal flushed: %v", id, escaped)
	}
}

// TestSealWatchedDuringTurn: `nft flush ruleset` on the host while a turn's
// cage streams datagrams at the LAN router (one every 10 ms). Without a
// watcher (positive control) the stream gets through from the flush to the
// end of the turn; with the runner's seal watcher nothing gets through
// later than a second after the flush, and the turn result says the seal
// was lost and put back.
func TestSealWatchedDuringTurn(t *testing.T) {
	e := newTBEnv(t)
	ctx := context.Background()
	verified := func(ctx context.Context, cfg *config.Config, _ bool) (turn.SealState, error) {
		st, err := firewall.Verify(ctx, cfg.Network, e.FW)
		if err != nil {
			return turn.SealState{}, err
		}
		if !st.OK {
			return turn.SealState{}, fmt.Errorf("%s", st.Reason)
		}
		return sealState(e, cfg, st)
	}
	natAfter := map[string]bool{}
	// natBack: the cage network's NAT was in place when the turn ended
	// (before the test puts it back).
	natBack := func() bool {
		_, err := e.TB.Exec("host", "nft", "list", "table", "inet", cagelink.NATTable(e.Net))
		return err == nil
	}
	turnWithFlush := func(t *testing.T, watch turn.SealWatcher, breakSeal ...string) (*turn.Result, error, []time.Duration) {
		t.Helper()
		assert.NilError(t, firewall.Apply(ctx, e.Cfg.Network, e.FW))
		e.N++
		nonce := fmt.Sprintf("%s-w%d", e.Prefix, e.N)
		r := turn.NewRunner(e.Cfg, e.Client, verified)
		r.WatchSeal = watch
		r.Resolver = cagenet.Resolver(e.FW, e.TB.DialContext("host"))
		// The host seal's watcher on its own: with the in-cage wall a
		// flush opens nothing (TestCageWallFlood).
		r.CageWall = noWall
		type ran struct {
			res *turn.Result
			err error
		}
		done := make(chan ran, 1)
		go func() {
			res, err := r.Run(ctx, turn.Request{
				Task: taskid.Must(fmt.Sprintf("%s-%d", e.Prefix, e.N)), Agent: "shell",
				Command: []string{"/tbprobe", "stream", net.JoinHostPort(testbed.RouterAddr4.String(), "5000"), nonce, "6"},
				ExtraMounts: []mounts.Mount{{Kind: mounts.Bind, Source: e.Probe, Dest: "/tbprobe", ReadOnly: true,
					Options: []string{"rbind", "nosuid", "nodev"}}},
				Timeout: 60 * time.Second,
			})
			done <- ran{res, err}
		}()
		time.Sleep(3 * time.Second) // the cage is streaming (into the seal)
		at := time.Now()
		if len(breakSeal) == 0 {
			breakSeal = []string{"nft", "flush", "ruleset"}
		}
		out, err := e.TB.Exec("host", breakSeal...)
		assert.NilError(t, err, string(out))
		got := <-done
		if len(breakSeal) == 3 && breakSeal[1] == "flush" {
			natAfter[t.Name()] = natBack()
		}
		var since []time.Duration
		for _, h := range e.TB.Hits(nonce) {
			since = append(since, h.At.Sub(at))
		}
		// The cage network's NAT went with the flush: put it back.
		assert.NilError(t, e.RestoreAfterFlush(context.Background()))
		return got.res, got.err, since
	}

	t.Run("positive control: no watcher, the flush opens the seal until the turn ends", func(t *testing.T) {
		res, err, since := turnWithFlush(t, nil)
		assert.Check(t, !natAfter[t.Name()], "positive control: the flush did not take the NAT table")
		assert.NilError(t, err, "%+v", res)
		late := 0
		for _, d := range since {
			assert.Check(t, d >= 0, "the sealed stream reached the router %v before the flush", -d)
			if d > time.Second {
				late++
			}
		}
		assert.Assert(t, late > 0, "no datagram got through more than a second after the flush (%d in all): the test could not see the hole", len(since))
		assert.Equal(t, len(res.SealLosses), 0)
	})

	t.Run("the runner's watcher puts the seal back within a second", func(t *testing.T) {
		res, err, since := turnWithFlush(t, cagenet.Watcher(e.FW))
		assert.NilError(t, err, "%+v", res)
		assert.Equal(t, res.Status, "exited")
		// The watcher put the cage network's NAT back with the seal.
		assert.Check(t, natAfter[t.Name()], "the NAT table was not restored during the turn")
		var last time.Duration
		for _, d := range since {
			assert.Check(t, d >= 0, "the sealed stream reached the router %v before the flush", -d)
			assert.Check(t, d <= time.Second, "SEAL NOT RESTORED: a datagram reached the router %v after the flush", d)
			last = max(last, d)
		}
		t.Logf("after the flush %d datagrams reached the router, the last %v after it", len(since), last)
		assert.Assert(t, len(res.SealLosses) >= 1, "the turn result does not report the lost seal")
		assert.Assert(t, res.SealLosses[0].Reapplied, "%+v", res.SealLosses[0])
		t.Logf("turn result: %+v", res.SealLosses)
		st, err := firewall.Verify(ctx, e.Cfg.Network, e.FW)
		assert.NilError(t, err)
		assert.Assert(t, st.OK, st.Reason)
	})

	t.Run("a seal that cannot be put back stops the cage", func(t *testing.T) {
		// With bridged traffic no longer passing the inet hooks the seal
		// cannot hold, and Apply refuses: the turn must end, not go on.
		defer func() {
			out, err := e.TB.Exec("host", "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1")
			assert.NilError(t, err, string(out))
		}()
		start := time.Now()
		res, err, _ := turnWithFlush(t, cagenet.Watcher(e.FW), "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0")
		assert.Assert(t, err != nil, "the turn reported success")
		assert.Equal(t, res.Status, "seal-lost", res.Error)
		assert.Assert(t, res.Removed)
		assert.Assert(t, len(res.SealLosses) == 1 && !res.SealLosses[0].Reapplied && res.SealLosses[0].Error != "", "%+v", res.SealLosses)
		assert.Assert(t, time.Since(start) < 8*time.Second, "the cage ran on for %v (its stream lasts 6 s after a 3 s start)", time.Since(start))
		t.Logf("turn result: %s; %+v", res.Error, res.SealLosses)
	})
}

func attempts(r *Report, id string) []Attempt {
	for _, c := range r.Checks {
		if c.ID == id {
			return c.Nonces
		}
	}
	return nil
}

// TestBatteryUnderAllowlist: with policy allowlist (the internet canary's
// addresses and one name) the DNS rows are sealed: the cage's own resolver
// answers only the listed name (D9a's and D9e's canary names are refused
// before any query leaves), direct resolvers and DoT are dropped (D9b,
// D9c); nothing escapes.
func TestBatteryUnderAllowlist(t *testing.T) {
	e := newTBEnv(t)
	ctx := context.Background()
	e.Cfg.Network.Policy = "allowlist"
	e.Cfg.Network.Allow = []string{testbed.InternetAddr4.String() + "/32", testbed.InternetAddr6.String() + "/128", "api.allowed.test"}
	e.FW.Resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return e.TB.DialContext("host")(ctx, network, net.JoinHostPort(testbed.InternetAddr4.String(), "53"))
	}}
	assert.NilError(t, firewall.Apply(ctx, e.Cfg.Network, e.FW))
	verified := func(ctx context.Context, cfg *config.Config, _ bool) (turn.SealState, error) {
		st, err := firewall.Verify(ctx, cfg.Network, e.FW)
		if err != nil {
			return turn.SealState{}, err
		}
		if !st.OK {
			return turn.SealState{}, fmt.Errorf("%s", st.Reason)
		}
		return sealState(e, cfg, st)
	}
	rep, _, _ := runBattery(t, e, verified, battery{})
	assert.DeepEqual(t, rep.IDs(Escaped), []string(nil))
	v := rep.Verdicts()
	for _, id := range []string{"D9a", "D9b", "D9c", "D9e"} {
		assert.Check(t, v[id] == Sealed, "%s: %s", id, v[id])
	}
}
