package probe_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"net"
	"os/exec"
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
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// wallTurn runs one shrooms turn in the testbed whose command is cmd, with
// tbprobe mounted, the real seal check and the seal watcher; off turns
// the in-cage wall off (positive controls only). during runs while the
// turn does.
func wallTurn(t *testing.T, e *tbworld.World, off bool, cmd []string, during func()) (*turn.Result, string) {
	t.Helper()
	ctx := context.Background()
	e.N++
	r := turn.NewRunner(e.Cfg, e.Client, func(ctx context.Context, cfg *config.Config, dry bool) (turn.SealState, error) {
		return cagenet.CheckSeal(ctx, cfg, e.Client, e.FW, dry)
	})
	r.Resolver = cagenet.Resolver(e.FW, e.TB.DialContext("host"))
	r.WatchSeal = cagenet.Watcher(e.FW)
	if off {
		r.CageWall = noWall
	}
	var out bytes.Buffer
	done := make(chan struct{})
	var res *turn.Result
	var err error
	go func() {
		defer close(done)
		res, err = r.Run(ctx, turn.Request{
			Task: taskid.Must(fmt.Sprintf("%s-wall%d", e.Prefix, e.N)), Agent: "shell", Command: cmd,
			ExtraMounts: []mounts.Mount{{Kind: mounts.Bind, Source: e.Probe, Dest: "/tbprobe", ReadOnly: true,
				Options: []string{"rbind", "nosuid", "nodev"}}},
			Timeout: 60 * time.Second,
			Streams: podman.Streams{Stdout: &out, Stderr: &out},
		})
	}()
	if during != nil {
		during()
	}
	<-done
	assert.NilError(t, err, "%+v", res)
	for _, p := range res.Phases {
		if p.Name == "wall" {
			t.Logf("fresh cage: wall phase (pid, install, verify) %.1f ms", p.Ms)
		}
	}
	return res, out.String()
}

// TestCageWallFlood is issue 29's flood test: a turn's cage sends UDP to
// the LAN router and the metadata service (v4 and v6) every millisecond
// while the host runs `nft flush ruleset` twice. With the in-cage wall, 0
// datagrams reach them (the seal watcher puts the host seal back within
// its interval, but the cage's own wall never left). Positive control: the
// same turn with the wall switched off (a test-only runner field) — the
// datagrams arrive in the windows after each flush, as before the wall.
// The internet target is the control that the cage was flooding at all.
func TestCageWallFlood(t *testing.T) {
	e := newTBEnv(t)
	ctx := context.Background()
	flood := func(t *testing.T, off bool) (map[int][]time.Duration, *turn.Result) {
		nonce := fmt.Sprintf("%s-f%d", e.Prefix, e.N+1)
		targets := []string{
			net.JoinHostPort(testbed.RouterAddr4.String(), "5000"), net.JoinHostPort(testbed.Metadata4.String(), "5000"),
			net.JoinHostPort(testbed.RouterAddr6.String(), "5000"), net.JoinHostPort(testbed.Metadata6.String(), "5000"),
			net.JoinHostPort(testbed.InternetAddr4.String(), "5000"),
		}
		var flushes []time.Time
		res, out := wallTurn(t, e, off, append([]string{"/tbprobe", "flood", nonce, "7"}, targets...), func() {
			time.Sleep(3500 * time.Millisecond) // the cage is flooding
			for i := 0; i < 2; i++ {
				flushes = append(flushes, time.Now())
				b, err := e.TB.Exec("host", "nft", "flush", "ruleset")
				assert.NilError(t, err, string(b))
				time.Sleep(1500 * time.Millisecond)
			}
		})
		t.Logf("flood: %s", strings.TrimSpace(out))
		// The cage network's NAT went with the flushes: put it back.
		assert.NilError(t, e.RestoreAfterFlush(context.Background()))
		hits := map[int][]time.Duration{}
		for i := range targets {
			for _, h := range e.TB.Hits(fmt.Sprintf("%s-t%d-", nonce, i)) {
				hits[i] = append(hits[i], h.At.Sub(flushes[0]))
			}
		}
		return hits, res
	}

	t.Run("positive control: without the in-cage wall the flushes open windows", func(t *testing.T) {
		hits, res := flood(t, true)
		assert.Assert(t, len(hits[4]) > 100, "the internet canary saw %d datagrams: the cage did not flood", len(hits[4]))
		lan := 0
		for i := 0; i < 4; i++ {
			for _, d := range hits[i] {
				assert.Check(t, d >= 0, "target %d reached %v before the first flush", i, -d)
			}
			lan += len(hits[i])
		}
		t.Logf("through the windows: router v4 %d, metadata v4 %d, router v6 %d, metadata v6 %d; seal losses %d", len(hits[0]), len(hits[1]), len(hits[2]), len(hits[3]), len(res.SealLosses))
		assert.Assert(t, len(hits[0]) > 0 && len(hits[1]) > 0, "no datagram reached the router or metadata after a flush without the wall: the test could not see the hole")
		assert.Assert(t, len(res.SealLosses) >= 2, "%+v", res.SealLosses)
	})

	t.Run("with the in-cage wall: 0 datagrams reach the LAN or metadata", func(t *testing.T) {
		hits, res := flood(t, false)
		assert.Assert(t, len(hits[4]) > 100, "the internet canary saw %d datagrams: the cage did not flood", len(hits[4]))
		for i, name := range []string{"router v4", "metadata v4", "router v6", "metadata v6"} {
			assert.Check(t, len(hits[i]) == 0, "WALL BREACHED: %d datagrams reached %s (%v)", len(hits[i]), name, hits[i])
		}
		assert.Assert(t, res.CageWall != nil && res.CageWall.OK, "%+v", res.CageWall)
		assert.Assert(t, len(res.SealLosses) >= 2, "the flushes were not seen: %+v", res.SealLosses)
		st, err := firewall.Verify(ctx, e.Cfg.Network, e.FW)
		assert.NilError(t, err)
		assert.Assert(t, st.OK, st.Reason)
	})
}

// TestCageWallUnchangeable: the cage cannot change its in-namespace rules
// — nft over netlink (add a table, delete the wall, flush the ruleset)
// and rtnetlink (an address, a route) get EPERM, also from a user
// namespace of its own. Positive control: the same probe in a bare podman
// cage given CAP_NET_ADMIN changes the ruleset.
func TestCageWallUnchangeable(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newTBEnv(t)
	script := "/tbprobe nft; ip addr add 10.77.0.1/32 dev eth0 2>&1; ip route add 10.78.0.0/16 dev eth0 2>&1; " +
		"unshare -U -r /tbprobe nft 2>&1 || echo unshare refused; true"
	res, out := wallTurn(t, e, false, []string{"sh", "-c", script}, nil)
	assert.Equal(t, res.ExitCode, 0, out)
	assert.Assert(t, res.CageWall != nil && res.CageWall.OK, "%+v", res.CageWall)
	t.Logf("inside the cage: %s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var first map[string]string
	assert.NilError(t, json.Unmarshal([]byte(lines[0]), &first), out)
	// shrooms' seccomp profile does not even let it open a netfilter
	// netlink socket; the missing capability is the layer below (next).
	for _, k := range []string{"add", "delete_wall", "flush_ruleset"} {
		assert.Check(t, strings.Contains(first[k], "operation not permitted") || strings.Contains(first[k], "protocol not supported"), "%s: %q", k, first[k])
	}
	assert.Check(t, strings.Count(out, "Operation not permitted") >= 2, "ip addr/route were not refused: %s", out)
	if len(lines) > 3 && strings.HasPrefix(lines[3], "{") {
		var userns map[string]string
		assert.NilError(t, json.Unmarshal([]byte(lines[3]), &userns))
		for _, k := range []string{"add", "delete_wall", "flush_ruleset"} {
			assert.Check(t, userns[k] != "", "from a user namespace, %s worked", k)
		}
	}

	// Without shrooms' seccomp profile (podman's default lets netlink
	// through) the missing capability alone refuses: EPERM.
	b, err := exec.Command("podman", "--url", e.TB.PodmanURL, "run", "--rm", "--label", e.TB.Label(), "--network", "none",
		"--cap-drop", "ALL", "--security-opt", "no-new-privileges", "-v", e.Probe+":/tbprobe:ro", itest.TestImage, "/tbprobe", "nft").CombinedOutput()
	assert.NilError(t, err, string(b))
	var capless map[string]string
	assert.NilError(t, json.Unmarshal(bytes.TrimSpace(b), &capless), string(b))
	for _, k := range []string{"add", "delete_wall", "flush_ruleset"} {
		assert.Check(t, strings.Contains(capless[k], "operation not permitted"), "no capabilities, podman's seccomp: %s: %q", k, capless[k])
	}

	// Positive control: with CAP_NET_ADMIN the same probe changes the
	// cage's ruleset (so EPERM above is the missing capability).
	b, err = exec.Command("podman", "--url", e.TB.PodmanURL, "run", "--rm", "--label", e.TB.Label(), "--network", "none",
		"--cap-drop", "ALL", "--cap-add", "NET_ADMIN", "-v", e.Probe+":/tbprobe:ro", itest.TestImage, "/tbprobe", "nft").CombinedOutput()
	assert.NilError(t, err, string(b))
	var ctl map[string]string
	assert.NilError(t, json.Unmarshal(bytes.TrimSpace(b), &ctl), string(b))
	assert.Equal(t, ctl["add"], "", "with CAP_NET_ADMIN: %v", ctl)
	assert.Equal(t, ctl["flush_ruleset"], "", "with CAP_NET_ADMIN: %v", ctl)
}

// TestPreparedCageWall: a prepared networked cage gets its in-cage wall at
// preparation (verified there, with no process of the cage running), and
// the turn that takes it only checks it (the "wall" phase is the per-turn
// cost on a prepared cage). A prepared cage whose wall was removed since is
// walled again before it starts: the running cage has its wall.
func TestPreparedCageWall(t *testing.T) {
	e := newTBEnv(t)
	ctx := context.Background()
	r := turn.NewRunner(e.Cfg, e.Client, func(ctx context.Context, cfg *config.Config, dry bool) (turn.SealState, error) {
		return cagenet.CheckSeal(ctx, cfg, e.Client, e.FW, dry)
	})
	r.Resolver = cagenet.Resolver(e.FW, e.TB.DialContext("host"))
	r.Binary = shroomsBinary(t)
	st, err := cagenet.CheckSeal(ctx, e.Cfg, e.Client, e.FW, true)
	assert.NilError(t, err)
	req := turn.Request{Task: taskid.Must(e.Prefix + "-prep"), Agent: "shell", Args: []string{"-c", "sleep 3"}, Timeout: 60 * time.Second}
	cagePid := func(id string) int {
		out := strings.TrimSpace(e.TB.MustPodman("inspect", "-f", "{{.State.Pid}}", id))
		var pid int
		_, err := fmt.Sscan(out, &pid)
		assert.NilError(t, err, out)
		return pid
	}
	for i, tamper := range []bool{false, true} {
		id, err := r.PrepareNext(ctx, req)
		assert.NilError(t, err)
		ws, err := firewall.VerifyWall(ctx, st.Rules, firewall.Options{NetNS: cagenet.CageNetNS(cagePid(id))})
		assert.NilError(t, err)
		assert.Assert(t, ws.OK, "prepared cage %d has no wall: %s", i, ws.Reason)
		if tamper {
			b, err := e.TB.Exec("host", "nsenter", "--net="+cagenet.CageNetNS(cagePid(id)), "nft", "delete", "table", "inet", firewall.WallTable)
			assert.NilError(t, err, string(b))
		}
		var during firewall.WallStatus
		done := make(chan struct{})
		go func() {
			defer close(done)
			time.Sleep(1500 * time.Millisecond)
			during, _ = firewall.VerifyWall(ctx, st.Rules, firewall.Options{NetNS: cagenet.CageNetNS(cagePid(id))})
		}()
		res, err := r.Run(ctx, req)
		<-done
		assert.NilError(t, err, "%+v", res)
		assert.Assert(t, res.Prepared, "the prepared cage was not taken: %+v", res)
		assert.Assert(t, res.CageWall != nil && res.CageWall.OK, "%+v", res.CageWall)
		assert.Assert(t, during.OK, "the running prepared cage (tampered=%v) has no wall: %s", tamper, during.Reason)
		for _, p := range res.Phases {
			if p.Name == "wall" {
				t.Logf("prepared cage (wall removed: %v): wall phase %.1f ms", tamper, p.Ms)
			}
		}
	}
}

// TestCageWallPerPolicyTurn: a shrooms turn under each networked policy
// has the in-cage wall that policy implies, as nft lists it inside the
// running cage, and it behaves so: the allowlisted internet address is
// reached under both, the unlisted one only under internet, the LAN router
// under neither.
func TestCageWallPerPolicyTurn(t *testing.T) {
	e := newTBEnv(t)
	ctx := context.Background()
	internet := e.Cfg.Network
	t.Cleanup(func() { e.Cfg.Network = internet; _ = firewall.Apply(context.Background(), internet, e.FW) })
	for _, tc := range []struct {
		policy     string
		want, nope []string
		unlisted   bool
	}{
		// DNS leaves the cage only through its own resolver on loopback:
		// every DNS port outward is dropped under every policy.
		{"internet", []string{"policy drop", "meta nfproto ipv4 accept", "daddr @routed4 counter", "udp dport @dnsports counter"}, []string{"@allow4", "dport 53 accept"}, true},
		{"allowlist", []string{"policy drop", "@allow4 accept", "@names4 accept"}, []string{"meta nfproto ipv4 accept", "dport 53 accept"}, false},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			e.Cfg.Network = internet
			e.Cfg.Network.Policy = tc.policy
			if tc.policy == "allowlist" {
				e.Cfg.Network.Allow = []string{testbed.InternetAddr4.String() + "/32"}
			}
			assert.NilError(t, firewall.Apply(ctx, e.Cfg.Network, e.FW))
			n := fmt.Sprintf("%s-pp%d", e.Prefix, e.N)
			task := fmt.Sprintf("%s-wall%d", e.Prefix, e.N+1)
			var listing string
			cmd := []string{"sh", "-c", fmt.Sprintf("/tbprobe tcp,%s,80,%s-in tcp,%s,80,%s-un udp,%s,5000,%s-lan; sleep 3",
				testbed.InternetAddr4, n, testbed.Internet2Addr4, n, testbed.RouterAddr4, n)}
			res, out := wallTurn(t, e, false, cmd, func() {
				time.Sleep(2500 * time.Millisecond)
				// By name, not by listing: podman's listing trips over
				// cages of other testbeds (their namespaces are not ours).
				pid, err := e.Client.Pid(ctx, sealed.Name(taskid.Must(task), 1))
				if !assert.Check(t, err) {
					return
				}
				b, err := e.TB.Exec("host", "nsenter", "--net="+cagenet.CageNetNS(pid), "nft", "list", "table", "inet", firewall.WallTable)
				assert.Check(t, err, string(b))
				listing = string(b)
			})
			assert.Equal(t, res.ExitCode, 0, out)
			assert.Assert(t, res.CageWall != nil && res.CageWall.OK && res.CageWall.Rules == res.SealRules, "%+v %s", res.CageWall, res.SealRules)
			for _, w := range tc.want {
				assert.Check(t, strings.Contains(listing, w), "%s: no %q in the cage's wall:\n%s", tc.policy, w, listing)
			}
			for _, w := range tc.nope {
				assert.Check(t, !strings.Contains(listing, w), "%s: %q in the cage's wall:\n%s", tc.policy, w, listing)
			}
			time.Sleep(300 * time.Millisecond)
			assert.Check(t, len(e.TB.Hits(n+"-in")) > 0, "positive control: the allowed internet address was not reached")
			assert.Check(t, (len(e.TB.Hits(n+"-un")) > 0) == tc.unlisted, "unlisted internet address reached: %v", len(e.TB.Hits(n+"-un")) > 0)
			assert.Check(t, len(e.TB.Hits(n+"-lan")) == 0, "the LAN router was reached")
		})
	}
}
