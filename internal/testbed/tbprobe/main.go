// Command tbprobe runs inside a test cage and sends one tagged packet per
// argument, so the testbed's canaries can tell which probe reached them.
// Each argument is PROTO,ADDR,PORT,NONCE with PROTO one of tcp, udp, icmp
// (unprivileged ICMP echo; PORT ignored), mcast (UDP to a multicast or
// broadcast group out of every interface, any answer counts), dns or dnstcp (a query for
// NONCE.canary.test sent to ADDR:PORT over UDP or TCP). With the single argument "listen" it is a canary
// instead: it logs every TCP (8080) and UDP (5000) payload to stdout. All probes run at once; one JSON line per probe is
// printed with what the prober saw. Verdicts come from the canaries. With "stream ADDR:PORT NONCE SECONDS" it sends a
// UDP datagram "NONCE-SEQ" every 10 ms for SECONDS seconds, for tests that watch traffic stop. With
// "flood NONCE SECONDS ADDR:PORT..." it sends "NONCE-tI-SEQ" to the I-th target every millisecond. With "nft" it tries
// to change the nftables ruleset of its own network namespace over netlink and prints the errno.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

type result struct {
	Probe  string `json:"probe"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

const timeout = 2 * time.Second

func main() {
	if len(os.Args) == 2 && os.Args[1] == "listen" {
		listen()
		return
	}
	if len(os.Args) == 5 && os.Args[1] == "stream" {
		stream(os.Args[2], os.Args[3], os.Args[4])
		return
	}
	if len(os.Args) >= 5 && os.Args[1] == "flood" {
		flood(os.Args[2], os.Args[3], os.Args[4:])
		return
	}
	if len(os.Args) == 2 && os.Args[1] == "nft" {
		tryNft()
		return
	}
	results := make([]result, len(os.Args)-1)
	var wg sync.WaitGroup
	for i, arg := range os.Args[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, detail := run(arg)
			results[i] = result{Probe: arg, OK: ok, Detail: detail}
		}()
	}
	wg.Wait()
	enc := json.NewEncoder(os.Stdout)
	for _, r := range results {
		enc.Encode(r)
	}
}

func run(arg string) (bool, string) {
	f := strings.Split(arg, ",")
	if len(f) != 4 {
		return false, "bad probe " + arg
	}
	proto, addr, port, nonce := f[0], f[1], f[2], f[3]
	hp := net.JoinHostPort(addr, port)
	switch proto {
	case "tcp":
		c, err := net.DialTimeout("tcp", hp, timeout)
		if err != nil {
			return false, err.Error()
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write([]byte(nonce + "\n")); err != nil {
			return false, err.Error()
		}
		b := make([]byte, 64)
		n, err := c.Read(b)
		if n > 0 {
			return true, strings.TrimSpace(string(b[:n]))
		}
		return false, fmt.Sprint("no reply: ", err)
	case "udp":
		c, err := net.Dial("udp", hp)
		if err != nil {
			return false, err.Error()
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write([]byte(nonce + "\n")); err != nil {
			return false, err.Error()
		}
		b := make([]byte, 64)
		n, err := c.Read(b)
		if n > 0 {
			return true, strings.TrimSpace(string(b[:n]))
		}
		return false, fmt.Sprint("no reply: ", err)
	case "icmp":
		return ping(addr, nonce)
	case "mcast":
		return group(addr, port, nonce)
	case "dns", "dnstcp":
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			if proto == "dnstcp" {
				network = "tcp" // the resolver frames by connection type
			}
			return (&net.Dialer{}).DialContext(ctx, network, hp)
		}}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		as, err := r.LookupHost(ctx, nonce+".canary.test")
		if err != nil {
			return false, err.Error()
		}
		return true, strings.Join(as, " ")
	}
	return false, "unknown proto " + proto
}

// group sends nonce to a multicast or broadcast address from an
// unconnected socket (a connected one would drop the answer, which comes
// from the responder's unicast address) out of every non-loopback
// interface, and reports the first answer.
func group(addr, port, nonce string) (bool, string) {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return false, err.Error()
	}
	network := "udp4"
	if a.Is6() {
		network = "udp6"
	}
	pc, err := net.ListenPacket(network, ":0")
	if err != nil {
		return false, err.Error()
	}
	defer pc.Close()
	ifs, _ := net.Interfaces()
	var sent []string
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback != 0 || i.Flags&net.FlagUp == 0 {
			continue
		}
		dst, err := net.ResolveUDPAddr(network, net.JoinHostPort(addr+map[bool]string{true: "%" + i.Name}[a.Is6()], port))
		if err != nil {
			return false, err.Error()
		}
		if _, err := pc.WriteTo([]byte(nonce+"\n"), dst); err != nil {
			return false, "send: " + err.Error()
		}
		sent = append(sent, i.Name)
	}
	if len(sent) == 0 {
		return false, "no interface to send on"
	}
	pc.SetReadDeadline(time.Now().Add(timeout))
	b := make([]byte, 256)
	n, from, err := pc.ReadFrom(b)
	if err != nil {
		return false, fmt.Sprintf("sent on %v, no reply: %v", sent, err)
	}
	return true, fmt.Sprintf("%s from %s", strings.TrimSpace(string(b[:n])), from)
}

// ping sends one ICMP echo over an unprivileged ICMP socket (no NET_RAW;
// needs net.ipv4.ping_group_range to include our gid) with nonce as data.
func ping(addr, nonce string) (bool, string) {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return false, err.Error()
	}
	var fd int
	var sa unix.Sockaddr
	var typ byte = 8
	if a.Is4() {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP)
		sa = &unix.SockaddrInet4{Addr: a.As4()}
	} else {
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_ICMPV6)
		sa = &unix.SockaddrInet6{Addr: a.As16()}
		typ = 128
	}
	if err != nil {
		return false, "icmp socket: " + err.Error()
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	msg := append([]byte{typ, 0, 0, 0, 0, 0, 0, 1}, []byte(nonce)...)
	if err := unix.Sendto(fd, msg, 0, sa); err != nil {
		return false, "send: " + err.Error()
	}
	b := make([]byte, 256)
	n, _, err := unix.Recvfrom(fd, b, 0)
	if err != nil {
		return false, "no reply: " + err.Error()
	}
	return n > 8 && strings.Contains(string(b[8:n]), nonce), "echo reply"
}

// listen is the canary of a target cage: one stdout line per payload.
func listen() {
	ln, err := net.Listen("tcp", ":8080")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pc, err := net.ListenPacket("udp", ":5000")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var mu sync.Mutex
	logLine := func(proto, s string) {
		mu.Lock()
		fmt.Printf("hit %s %s\n", proto, strings.TrimSpace(s))
		mu.Unlock()
	}
	go func() {
		b := make([]byte, 256)
		for {
			n, from, err := pc.ReadFrom(b)
			if err != nil {
				return
			}
			logLine("udp", string(b[:n]))
			pc.WriteTo([]byte("canary cage\n"), from)
		}
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(3 * time.Second))
			b := make([]byte, 256)
			n, _ := c.Read(b)
			logLine("tcp", string(b[:n]))
			c.Write([]byte("canary cage\n"))
		}()
	}
}

// stream sends numbered datagrams from an unconnected socket (errors such
// as an ICMP unreachable do not stop it) until the time is up.
func stream(hp, nonce, secs string) {
	var n int
	fmt.Sscan(secs, &n)
	dst, err := net.ResolveUDPAddr("udp", hp)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pc, err := net.ListenPacket("udp", ":0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer pc.Close()
	end := time.Now().Add(time.Duration(n) * time.Second)
	for seq := 0; time.Now().Before(end); seq++ {
		pc.WriteTo([]byte(fmt.Sprintf("%s-%d\n", nonce, seq)), dst)
		time.Sleep(10 * time.Millisecond)
	}
}

// flood sends numbered datagrams to every target every millisecond until
// the time is up, then prints how many it sent and how many the kernel
// refused (EPERM from a local firewall).
func flood(nonce, secs string, targets []string) {
	var n int
	fmt.Sscan(secs, &n)
	var dsts []*net.UDPAddr
	for _, t := range targets {
		d, err := net.ResolveUDPAddr("udp", t)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		dsts = append(dsts, d)
	}
	pc, err := net.ListenPacket("udp", ":0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer pc.Close()
	sent, refused := 0, 0
	end := time.Now().Add(time.Duration(n) * time.Second)
	for seq := 0; time.Now().Before(end); seq++ {
		for i, d := range dsts {
			if _, err := pc.WriteTo([]byte(fmt.Sprintf("%s-t%d-%d\n", nonce, i, seq)), d); err != nil {
				refused++
			} else {
				sent++
			}
		}
		time.Sleep(time.Millisecond)
	}
	json.NewEncoder(os.Stdout).Encode(map[string]int{"sent": sent, "refused": refused})
}

// tryNft asks the kernel, over netlink, to add a table, to list the
// ruleset and to delete shrooms' in-cage wall in this network namespace,
// and prints each errno ("" when it worked).
func tryNft() {
	res := map[string]string{}
	errStr := func(err error) string {
		if err == nil {
			return ""
		}
		return err.Error()
	}
	c, err := nftables.New()
	if err != nil {
		res["open"] = errStr(err)
	} else {
		c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "cage_owned"})
		res["add"] = errStr(c.Flush())
		c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "shrooms_wall"})
		res["delete_wall"] = errStr(c.Flush())
		c.FlushRuleset()
		res["flush_ruleset"] = errStr(c.Flush())
		_, err := c.ListTables()
		res["list"] = errStr(err)
	}
	json.NewEncoder(os.Stdout).Encode(res)
}
