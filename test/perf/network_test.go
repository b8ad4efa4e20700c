package perf

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	nettypes "github.com/containers/common/libnetwork/types"
	"github.com/containers/podman/v5/pkg/specgen"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/tbworld"
	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/podman"
)

// BenchmarkCageNetworkParts takes the cage network apart: the same cage
// spec is created, initialised (namespaces, netavark setup) and removed
// (netavark teardown) with no network, on podman's default network (IPv4,
// no DNS), and on bridges like shrooms' own with and without IPv6 and
// podman's DNS server, interleaved; and the host-side checks a networked
// turn makes (seal verify and refresh, the MAC pin, the network
// inspection) are timed alone.
func BenchmarkCageNetworkParts(b *testing.B) {
	if b.N == 1 { // the testing package's probing run (see BenchmarkGoals)
		return
	}
	be := newBench(b)
	ctx := context.Background()
	task := be.Task("net")
	if _, _, err := runTurn(be, task, "shell", "true"); err != nil {
		b.Fatal(err)
	}
	be.WaitIdle(task)
	out, err := shrooms(be, "spec", "--task", task, "--agent", "shell", "--", "-c", "true")
	if err != nil {
		b.Fatalf("spec: %v: %s", err, out)
	}
	var base specgen.SpecGenerator
	if err := json.Unmarshal(out, &base); err != nil {
		b.Fatal(err)
	}
	pid := os.Getpid()
	variants := []struct {
		name string
		args []string // podman network create; nil: no network or an existing one
		net  string
	}{
		{name: "none"},
		{name: "podman-default", net: "podman"},
		{name: "cage-net", net: podmanCageNet(b, be)}, // a podman network like the cage network
		{name: "v4-dns", net: be.Prefix + "-4d", args: []string{"--subnet", fmt.Sprintf("10.%d.%d.0/24", 30+(pid+1)%30, pid%250)}},
		{name: "v4-nodns", net: be.Prefix + "-4", args: []string{"--disable-dns", "--subnet", fmt.Sprintf("10.%d.%d.0/24", 30+(pid+2)%30, pid%250)}},
		{name: "dual-nodns", net: be.Prefix + "-6", args: []string{"--disable-dns", "--subnet", fmt.Sprintf("10.%d.%d.0/24", 30+(pid+3)%30, pid%250), "--ipv6", "--subnet", fmt.Sprintf("fd8d:5eed:%x::/64", pid%65000)}},
	}
	for _, v := range variants {
		if v.args != nil {
			be.TB.MustPodman(append([]string{"network", "create", "--label", be.TB.Label()}, append(v.args, v.net)...)...)
			name := v.net
			b.Cleanup(func() { _, _ = be.TB.Podman("network", "rm", "-f", name) })
		}
	}
	if _, err := bareRun(be, "podman", "true"); err != nil { // the default network's bridge exists
		b.Fatal(err)
	}
	type times struct{ create, init, remove []time.Duration }
	got := map[string]*times{}
	for i := 0; i < b.N; i++ {
		for _, v := range variants {
			s := base
			s.Name = itest.UniqueName("pfnet-")
			s.Labels = map[string]string{"shrooms-tb": be.TB.ID}
			if v.net == "" {
				s.NetNS = specgen.Namespace{NSMode: specgen.NoNetwork}
				s.Networks = nil
				s.DNSServers = nil
			} else {
				s.NetNS = specgen.Namespace{NSMode: specgen.Bridge}
				s.Networks = map[string]nettypes.PerNetworkOptions{v.net: {}}
			}
			t0 := time.Now()
			id, err := be.Client.Create(ctx, &s)
			if err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			t1 := time.Now()
			if err := be.Client.Init(ctx, id); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			t2 := time.Now()
			if v.name == "cage-net" && i == 0 {
				b.Logf("IPv6 addresses in an initialised cage (if_inet6 flags: 0x40 tentative = DAD running, 0x02 nodad): %s", inet6Flags(ctx, be, id))
			}
			if err := be.Client.Remove(ctx, id); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			t3 := time.Now()
			g := got[v.name]
			if g == nil {
				g = &times{}
				got[v.name] = g
			}
			g.create = append(g.create, t1.Sub(t0))
			g.init = append(g.init, t2.Sub(t1))
			g.remove = append(g.remove, t3.Sub(t2))
		}
	}
	for _, v := range variants {
		g := got[v.name]
		b.ReportMetric(msOf(median(g.init)), v.name+"-init-ms")
		b.ReportMetric(msOf(median(g.remove)), v.name+"-remove-ms")
		b.Logf("%-15s create %6.1f  init %6.1f  remove %6.1f ms (medians)", v.name, msOf(median(g.create)), msOf(median(g.init)), msOf(median(g.remove)))
	}

	// The host-side checks of a networked turn, alone.
	opts := firewall.Options{NetNS: be.TB.NSPath("host")}
	part := func(name string, fn func() error) {
		var d []time.Duration
		for i := 0; i < 20; i++ {
			t0 := time.Now()
			if err := fn(); err != nil {
				b.Fatalf("%s: %v", name, err)
			}
			d = append(d, time.Since(t0))
		}
		b.ReportMetric(msOf(median(d)), name+"-ms")
		b.Logf("%-20s %6.2f ms (median of 20)", name, msOf(median(d)))
	}
	part("seal-verify", func() error {
		st, err := firewall.Verify(ctx, be.Cfg.Network, opts)
		if err == nil && !st.OK {
			err = fmt.Errorf("%s", st.Reason)
		}
		return err
	})
	part("seal-refresh", func() error {
		st, err := firewall.Refresh(ctx, be.Cfg.Network, opts)
		if err == nil && !st.OK {
			err = fmt.Errorf("%s", st.Reason)
		}
		return err
	})
	part("mac-pin", func() error { return firewall.PinBridgeMAC(be.Cfg.Network.Bridge, opts) })
	part("network-check", func() error { return cagenet.CheckNetwork(ctx, be.Cfg, be.Client) })
	part("image-exists", func() error { _, err := be.Client.ImageExists(ctx, itest.TestImage); return err })
	part("list-task-cages", func() error { _, err := be.Client.ListByLabel(ctx, "io.shrooms.task", task); return err })
	part("inspect-volume", func() error { _, err := be.Client.InspectVolume(ctx, be.Cfg.Home.VolumePrefix+task); return err })
	part("podman-connect", func() error { _, err := podman.Connect(ctx, be.TB.PodmanURL); return err })
	part("shrooms-version", func() error { _, err := shrooms(be, "version"); return err })
	b.ReportMetric(0, "ns/op")
}

// inet6Flags lists the cage's IPv6 addresses with their flags, read from its
// network namespace right after netavark configured it.
func inet6Flags(ctx context.Context, be *tbworld.World, id string) string {
	pid, err := be.Client.Pid(ctx, id)
	if err != nil {
		return err.Error()
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/if_inet6", pid))
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if f := strings.Fields(l); len(f) == 6 && f[5] != "lo" {
			out = append(out, f[5]+" "+f[0][:4]+"… flags 0x"+f[4])
		}
	}
	return strings.Join(out, "; ")
}
