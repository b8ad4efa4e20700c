package cagelink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

const (
	sub4 = "10.77.0.0/24"
	sub6 = "fd77:1::/64"
)

// bridgeState is what the kernel shows of the host side: the bridge's
// ifindex and addresses and the NAT table's handle (new each time it is
// made), to show that a call changed nothing.
func (w *world) bridgeState() string {
	w.t.Helper()
	h := w.handle(w.host)
	br, err := h.LinkByName(w.n.Bridge)
	assert.NilError(w.t, err)
	addrs, err := h.AddrList(br, netlink.FAMILY_ALL)
	assert.NilError(w.t, err)
	var as []string
	for _, a := range addrs {
		as = append(as, a.IPNet.String())
	}
	slices.Sort(as)
	return fmt.Sprintf("ifindex=%d mac=%s flags=%v addrs=%v table=%d", br.Attrs().Index, br.Attrs().HardwareAddr, br.Attrs().Flags, as, w.tableHandle())
}

func (w *world) ensureWrites() []string {
	w.t.Helper()
	var wr writes
	assert.NilError(w.t, ensureBridge(context.Background(), w.n, &wr))
	return wr.done
}

func TestEnsureBridgeFromNothingThenNoWrites(t *testing.T) {
	w := newWorld(t, sub4, sub6)
	// From nothing: a new namespace inherits IPv4 forwarding from the
	// machine's.
	w.in(w.host, func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("0"), 0o644) })
	w.in(w.host, func() error { return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("0"), 0o644) })
	exists, err := CheckBridge(w.n)
	assert.NilError(t, err)
	assert.Assert(t, !exists)

	assert.DeepEqual(t, w.ensureWrites(), []string{
		"create bridge", "address 10.77.0.1", "address fd77:1::1",
		"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding",
		"nat table (missing)",
	})
	exists, err = CheckBridge(w.n)
	assert.NilError(t, err)
	assert.Assert(t, exists)
	before := w.bridgeState()
	assert.Assert(t, w.tableHandle() > 0, before)
	assert.Assert(t, is.Contains(before, "10.77.0.1/24"))
	assert.Assert(t, is.Contains(before, "fd77:1::1/64"))
	assert.Assert(t, is.Contains(before, "up"))
	ruleset := nft(t, w.host, "list", "table", "inet", NATTable(w.n.Name))
	assert.Assert(t, is.Contains(ruleset, "type nat hook postrouting priority srcnat; policy accept;"), ruleset)
	assert.Assert(t, is.Contains(ruleset, "ip saddr 10.77.0.0/24 ip daddr != 10.77.0.0/24 ip daddr != 224.0.0.0/4 masquerade"), ruleset)
	assert.Assert(t, is.Contains(ruleset, "ip6 saddr fd77:1::/64 ip6 daddr != fd77:1::/64 ip6 daddr != ff00::/8 masquerade"), ruleset)

	// Already right: nothing written, nothing in the kernel changed.
	assert.Assert(t, is.Len(w.ensureWrites(), 0))
	assert.Equal(t, w.bridgeState(), before)

	// Each part, altered by hand, is found by CheckBridge and is the only
	// thing EnsureBridge writes back.
	hostH := w.handle(w.host)
	br, err := hostH.LinkByName(w.n.Bridge)
	assert.NilError(t, err)
	nft(t, w.host, "flush", "chain", "inet", NATTable(w.n.Name), "postrouting")
	_, err = CheckBridge(w.n)
	assert.ErrorContains(t, err, "rules differ")
	got := w.ensureWrites()
	assert.Assert(t, len(got) == 1 && strings.HasPrefix(got[0], "nat table (rules differ"), "%v", got)
	assert.Assert(t, w.tableHandle() != -1)

	assert.NilError(t, hostH.AddrDel(br, nlAddr(w.n.Gateway4(), 24)))
	_, err = CheckBridge(w.n)
	assert.ErrorContains(t, err, "does not carry gateway 10.77.0.1/24")
	assert.DeepEqual(t, w.ensureWrites(), []string{"address 10.77.0.1"})

	assert.NilError(t, hostH.LinkSetDown(br))
	_, err = CheckBridge(w.n)
	assert.ErrorContains(t, err, "is down")
	// Down took the IPv6 gateway with it (the kernel's rule, not ours).
	assert.DeepEqual(t, w.ensureWrites(), []string{"up", "address fd77:1::1"})

	w.in(w.host, func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("0"), 0o644) })
	_, err = CheckBridge(w.n)
	assert.ErrorContains(t, err, "ip_forward is not 1")
	assert.DeepEqual(t, w.ensureWrites(), []string{"/proc/sys/net/ipv4/ip_forward"})

	_, err = CheckBridge(w.n)
	assert.NilError(t, err)
	assert.Assert(t, is.Len(w.ensureWrites(), 0))
}

func TestEnsureBridgeLeavesANonBridgeAlone(t *testing.T) {
	w := newWorld(t, sub4, sub6)
	h := w.handle(w.host)
	attrs := netlink.NewLinkAttrs()
	attrs.Name = w.n.Bridge
	assert.NilError(t, h.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "other", PeerTxQLen: -1}))
	d, err := h.LinkByName(w.n.Bridge)
	assert.NilError(t, err)

	err = EnsureBridge(context.Background(), w.n)
	assert.ErrorContains(t, err, "is a veth, not a bridge")
	exists, err := CheckBridge(w.n)
	assert.Assert(t, exists)
	assert.ErrorContains(t, err, "not a bridge")
	assert.ErrorContains(t, Remove(w.n), "not a bridge")
	after, err := h.LinkByName(w.n.Bridge)
	assert.NilError(t, err)
	assert.Equal(t, after.Type(), "veth")
	assert.Equal(t, after.Attrs().Index, d.Attrs().Index)
	assert.Equal(t, after.Attrs().Flags&net.FlagUp, net.Flags(0))
	addrs, err := h.AddrList(after, netlink.FAMILY_ALL)
	assert.NilError(t, err)
	assert.Assert(t, is.Len(addrs, 0))
	assert.Equal(t, w.tableHandle(), -1)

	// Control: without the dummy the same Net is made.
	assert.NilError(t, h.LinkDel(after))
	w.ensure()
	exists, err = CheckBridge(w.n)
	assert.NilError(t, err)
	assert.Assert(t, exists)
}

func TestAttachConnectsToTheGateway(t *testing.T) {
	w := newWorld(t, sub4, sub6)
	w.ensure()
	cage := w.newNS("cage")
	l := w.attach(cage)
	assert.Assert(t, l.Index >= 2 && l.Index <= 254, "%+v", l)
	assert.Equal(t, l.Host, VethName(w.n.Bridge, l.Index))
	assert.Equal(t, l.Addr4, netip.MustParseAddr(fmt.Sprintf("10.77.0.%d", l.Index)))
	assert.Equal(t, l.Addr6, netip.MustParseAddr(fmt.Sprintf("fd77:1::%x", l.Index)))
	assert.DeepEqual(t, w.linkNames(cage), []string{"lo", "eth0"})
	got, err := Check(w.n, cage)
	assert.NilError(t, err)
	assert.Equal(t, got, l)

	// The cage's own view, by ip(8).
	addrs := ipIn(t, cage, "-br", "addr", "show", "dev", "eth0")
	assert.Assert(t, is.Contains(addrs, l.Addr4.String()+"/24"), addrs)
	assert.Assert(t, is.Contains(addrs, l.Addr6.String()+"/64"), addrs)
	assert.Assert(t, is.Contains(ipIn(t, cage, "route"), "default via 10.77.0.1 dev eth0"))
	assert.Assert(t, is.Contains(ipIn(t, cage, "-6", "route"), "default via fd77:1::1 dev eth0"))
	assert.Assert(t, is.Contains(ipIn(t, cage, "-br", "link", "show", "lo"), "UP"))

	for _, gw := range []netip.Addr{w.n.Gateway4(), w.n.Gateway6()} {
		ln := w.listen(w.host, gw)
		src, err := w.dial(cage, ln, netip.AddrPortFrom(gw, port(ln)))
		assert.NilError(t, err, "from the cage to %s", gw)
		assert.Assert(t, src == l.Addr4 || src == l.Addr6, "source %s", src)

		// Control: a cage that was not attached reaches nothing.
		bare := w.newNS(fmt.Sprintf("bare%d", gw.BitLen()))
		_, err = w.dial(bare, ln, netip.AddrPortFrom(gw, port(ln)))
		assert.Assert(t, errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EADDRNOTAVAIL), "%v", err)
	}

	assert.NilError(t, deleteNS(cage))
	w.waitGone(l.Host)
}

func TestNATMasqueradesLeavingTraffic(t *testing.T) {
	w := newWorld(t, sub4, sub6)
	w.ensure()
	cage := w.newNS("cage")
	l := w.attach(cage)
	outside := w.newNS("outside")

	// host up0 10.250.0.2 <-> outside dn0 10.250.0.1; the host's default
	// route goes outside; outside routes the cage subnet back (so that the
	// control, without NAT, can connect at all).
	h, o := w.handle(w.host), w.handle(outside)
	nsf, err := os.Open(outside)
	assert.NilError(t, err)
	defer nsf.Close()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "up0"
	attrs.Flags = net.FlagUp
	assert.NilError(t, h.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "dn0", PeerNamespace: netlink.NsFd(nsf.Fd()), PeerTxQLen: -1}))
	up, err := h.LinkByName("up0")
	assert.NilError(t, err)
	dn, err := o.LinkByName("dn0")
	assert.NilError(t, err)
	assert.NilError(t, o.LinkSetUp(dn))
	hostA4, outA4 := netip.MustParseAddr("10.250.0.2"), netip.MustParseAddr("10.250.0.1")
	hostA6, outA6 := netip.MustParseAddr("fdfa:250::2"), netip.MustParseAddr("fdfa:250::1")
	assert.NilError(t, h.AddrAdd(up, nlAddr(hostA4, 24)))
	assert.NilError(t, h.AddrAdd(up, nlAddr(hostA6, 64)))
	assert.NilError(t, o.AddrAdd(dn, nlAddr(outA4, 24)))
	assert.NilError(t, o.AddrAdd(dn, nlAddr(outA6, 64)))
	assert.NilError(t, h.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: net.IP(outA4.AsSlice())}))
	assert.NilError(t, h.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: net.IP(outA6.AsSlice())}))
	assert.NilError(t, o.RouteAdd(&netlink.Route{LinkIndex: dn.Attrs().Index, Dst: prefixNet(w.n.Subnet4), Gw: net.IP(hostA4.AsSlice())}))
	assert.NilError(t, o.RouteAdd(&netlink.Route{LinkIndex: dn.Attrs().Index, Dst: prefixNet(w.n.Subnet6), Gw: net.IP(hostA6.AsSlice())}))

	ln4, ln6 := w.listen(outside, outA4), w.listen(outside, outA6)
	src, err := w.dial(cage, ln4, netip.AddrPortFrom(outA4, port(ln4)))
	assert.NilError(t, err)
	assert.Equal(t, src, hostA4, "masqueraded to the host's address")
	src, err = w.dial(cage, ln6, netip.AddrPortFrom(outA6, port(ln6)))
	assert.NilError(t, err)
	assert.Equal(t, src, hostA6, "masqueraded to the host's address")

	// Control: without the NAT table the cage's own addresses arrive.
	nft(t, w.host, "delete", "table", "inet", NATTable(w.n.Name))
	src, err = w.dial(cage, ln4, netip.AddrPortFrom(outA4, port(ln4)))
	assert.NilError(t, err)
	assert.Equal(t, src, l.Addr4)
	src, err = w.dial(cage, ln6, netip.AddrPortFrom(outA6, port(ln6)))
	assert.NilError(t, err)
	assert.Equal(t, src, l.Addr6)
}

func TestAttachExhaustionV4OnlyAndRemove(t *testing.T) {
	w := newWorld(t, "10.77.0.0/29", "")
	assert.Assert(t, !w.n.Subnet6.IsValid())
	w.ensure()
	cages := map[int]string{}
	hosts := map[int]string{}
	for i := 0; i < 5; i++ {
		cage := w.newNS(fmt.Sprintf("cage%d", i))
		l := w.attach(cage)
		assert.Assert(t, !l.Addr6.IsValid())
		_, dup := cages[l.Index]
		assert.Assert(t, !dup && l.Index >= 2 && l.Index <= 6, "%+v", l)
		cages[l.Index], hosts[l.Index] = cage, l.Host
		got, err := Check(w.n, cage)
		assert.NilError(t, err)
		assert.Equal(t, got, l)
	}
	sixth := w.newNS("cage5")
	_, err := Attach(context.Background(), w.n, sixth)
	assert.Error(t, err, "cage network 10.77.0.0/29 is full: 5 cages")
	assert.DeepEqual(t, w.linkNames(sixth), []string{"lo"})
	assert.Assert(t, is.Len(w.veths(), 5))

	// A cage exits: its index is free again once the kernel has deleted
	// the veth.
	assert.NilError(t, deleteNS(cages[4]))
	w.waitGone(hosts[4])
	l := w.attach(sixth)
	assert.Equal(t, l.Index, 4)
	assert.Equal(t, l.Addr4, netip.MustParseAddr("10.77.0.4"))

	ruleset := nft(t, w.host, "list", "table", "inet", NATTable(w.n.Name))
	assert.Assert(t, !strings.Contains(ruleset, "ip6"), ruleset)
	assert.Assert(t, !strings.Contains(ipIn(t, sixth, "-6", "route"), "default"))
	_, err = CheckBridge(w.n)
	assert.NilError(t, err)

	assert.NilError(t, Remove(w.n))
	_, err = w.handle(w.host).LinkByName(w.n.Bridge)
	assert.Assert(t, isNotFound(err), "bridge still there: %v", err)
	assert.Equal(t, w.tableHandle(), -1)
	exists, err := CheckBridge(w.n)
	assert.NilError(t, err)
	assert.Assert(t, !exists)
	assert.NilError(t, Remove(w.n), "Remove of nothing")
}

func TestAttachConcurrent(t *testing.T) {
	// A /28 (13 indexes) for 8 cages: most of them meet a taken name.
	w := newWorld(t, "10.77.0.0/28", sub6)
	w.ensure()
	const k = 8
	cages := make([]string, k)
	for i := range cages {
		cages[i] = w.newNS(fmt.Sprintf("cage%d", i))
	}
	links := make([]Link, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range cages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			links[i], errs[i] = Attach(context.Background(), w.n, cages[i])
		}()
	}
	wg.Wait()
	seen := map[netip.Addr]bool{}
	for i, l := range links {
		assert.NilError(t, errs[i])
		assert.Assert(t, !seen[l.Addr4], "address %s twice", l.Addr4)
		seen[l.Addr4] = true
		got, err := Check(w.n, cages[i])
		assert.NilError(t, err)
		assert.Equal(t, got, l)
	}
	assert.Assert(t, is.Len(w.veths(), k))
}

func TestAttachRefusesANamespaceWithAnInterface(t *testing.T) {
	w := newWorld(t, sub4, sub6)
	w.ensure()
	cage := w.newNS("cage")
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "d0"
	assert.NilError(t, w.handle(cage).LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "d1", PeerTxQLen: -1}))
	before := w.linkNames(cage)
	assert.Equal(t, len(before), 3)
	_, err := Attach(context.Background(), w.n, cage)
	assert.ErrorContains(t, err, "already has interface d")
	assert.ErrorContains(t, err, ": refused")
	assert.DeepEqual(t, w.linkNames(cage), before)
	assert.Assert(t, is.Len(w.veths(), 0))

	// Control: an empty namespace is attached.
	w.attach(w.newNS("empty"))
	assert.Assert(t, is.Len(w.veths(), 1))
}

func TestCheckSaysWhatDiffers(t *testing.T) {
	w := newWorld(t, sub4, sub6)
	w.ensure()
	cage := w.newNS("cage")
	l := w.attach(cage)
	h, c := w.handle(w.host), w.handle(cage)
	ok := func() {
		t.Helper()
		got, err := Check(w.n, cage)
		assert.NilError(t, err)
		assert.Equal(t, got, l)
	}
	ok()

	host, err := h.LinkByName(l.Host)
	assert.NilError(t, err)
	br, err := h.LinkByName(w.n.Bridge)
	assert.NilError(t, err)
	assert.NilError(t, h.LinkSetNoMaster(host))
	_, err = Check(w.n, cage)
	assert.ErrorContains(t, err, l.Host+" is not a port of bridge "+w.n.Bridge)
	assert.NilError(t, h.LinkSetMaster(host, br))
	ok()

	eth, err := c.LinkByName("eth0")
	assert.NilError(t, err)
	gw4 := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(w.n.Gateway4().AsSlice())}
	assert.NilError(t, c.AddrDel(eth, nlAddr(l.Addr4, 24)))
	_, err = Check(w.n, cage)
	assert.ErrorContains(t, err, "eth0 has no address in 10.77.0.0/24")
	assert.NilError(t, c.AddrAdd(eth, nlAddr(l.Addr4, 24)))
	assert.NilError(t, c.RouteAdd(gw4)) // went with the address
	ok()

	assert.NilError(t, c.RouteDel(gw4))
	_, err = Check(w.n, cage)
	assert.ErrorContains(t, err, "no default route via 10.77.0.1 on eth0")
	assert.NilError(t, c.RouteAdd(gw4))
	ok()

	gw6 := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(w.n.Gateway6().AsSlice())}
	assert.NilError(t, c.RouteDel(gw6))
	_, err = Check(w.n, cage)
	assert.ErrorContains(t, err, "no default route via fd77:1::1 on eth0")
	assert.NilError(t, c.RouteAdd(gw6))
	ok()

	assert.NilError(t, c.LinkSetDown(eth))
	_, err = Check(w.n, cage)
	assert.ErrorContains(t, err, "eth0 is down")
}

func TestFromConfig(t *testing.T) {
	n, err := FromConfig(netConfig("shrooms", "10.89.0.0/24", "fd89::/64"), "")
	assert.NilError(t, err)
	assert.Equal(t, n.Gateway4(), netip.MustParseAddr("10.89.0.1"))
	assert.Equal(t, n.Gateway6(), netip.MustParseAddr("fd89::1"))
	assert.Equal(t, NATTable("shrooms"), "shroomsnat_shrooms")
	n4, err := FromConfig(netConfig("shrooms", "10.89.0.0/24", ""), "")
	assert.NilError(t, err)
	assert.Assert(t, !n4.Gateway6().IsValid())
	for _, bad := range [][2]string{{"10.89.0.1/24", ""}, {"10.89.0.0/30", ""}, {"10.0.0.0/7", ""}, {"fd89::/64", ""}, {"10.89.0.0/24", "fd89::/121"}, {"10.89.0.0/24", "10.1.0.0/16"}} {
		_, err := FromConfig(netConfig("shrooms", bad[0], bad[1]), "")
		assert.Assert(t, err != nil, "%v accepted", bad)
	}
	_, err = FromConfig(netConfig("a name", "10.89.0.0/24", ""), "")
	assert.ErrorContains(t, err, "network.name")
}

func TestVethName(t *testing.T) {
	seen := map[string]bool{}
	for _, br := range []string{"shrooms", "shrooms0", "a", "abcdefghijklmno"} {
		for _, idx := range []int{2, 255, 1<<24 - 2} {
			name := VethName(br, idx)
			assert.Assert(t, len(name) <= 15 && config.ValidIfName(name), name)
			assert.Assert(t, !seen[name], name)
			seen[name] = true
		}
	}
	assert.Equal(t, VethName("shrooms", 10), VethName("shrooms", 10))
}

// ipIn runs ip(8) in the namespace at path.
func ipIn(t *testing.T, path string, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + path, "ip"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
	return string(out)
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func TestEnsureBridgeConcurrentFromNothing(t *testing.T) {
	w := newWorld(t, sub4, sub6)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = EnsureBridge(context.Background(), w.n)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		assert.NilError(t, err)
	}
	exists, err := CheckBridge(w.n)
	assert.NilError(t, err)
	assert.Assert(t, exists)
	assert.Assert(t, is.Len(w.ensureWrites(), 0))
}

// A bridge whose address was never set takes the lowest MAC of its ports,
// changing the gateway's address under running cages; the one EnsureBridge
// makes keeps its own.
func TestBridgeMACStaysWhenALowerPortJoins(t *testing.T) {
	w := newWorld(t, sub4, sub6)
	w.ensure()
	h := w.handle(w.host)
	br, err := h.LinkByName(w.n.Bridge)
	assert.NilError(t, err)
	assert.Equal(t, br.Attrs().HardwareAddr.String(), bridgeMAC(w.n.Bridge).String())
	l := w.attach(w.newNS("cage"))
	host, err := h.LinkByName(l.Host)
	assert.NilError(t, err)
	low := net.HardwareAddr{0, 0, 0, 0, 0, 1}
	assert.NilError(t, h.LinkSetHardwareAddr(host, low))
	host, err = h.LinkByName(l.Host)
	assert.NilError(t, err)
	assert.Equal(t, host.Attrs().HardwareAddr.String(), low.String())
	br, err = h.LinkByName(w.n.Bridge)
	assert.NilError(t, err)
	assert.Equal(t, br.Attrs().HardwareAddr.String(), bridgeMAC(w.n.Bridge).String())
}

func TestAttachFailureLeavesNothing(t *testing.T) {
	w := newWorld(t, sub4, sub6)
	w.ensure()
	// A cage whose namespace refuses IPv6 addresses: the veth exists by
	// then, and must go.
	cage := w.newNS("cage")
	w.in(cage, func() error { return os.WriteFile("/proc/sys/net/ipv6/conf/default/disable_ipv6", []byte("1"), 0o644) })
	_, err := Attach(context.Background(), w.n, cage)
	assert.ErrorContains(t, err, "cage address fd77:1::")
	assert.Assert(t, !strings.Contains(err.Error(), "\n"), err.Error())
	assert.Assert(t, is.Len(w.veths(), 0))
	assert.DeepEqual(t, w.linkNames(cage), []string{"lo"})

	// Control: the same cage with a v4-only network is attached.
	v4 := w.n
	v4.Subnet6 = netip.Prefix{}
	l, err := Attach(context.Background(), v4, cage)
	assert.NilError(t, err)
	assert.DeepEqual(t, w.veths(), []string{l.Host})
}
