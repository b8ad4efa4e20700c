package probe

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/signal"
	"strings"
	"syscall"
)

// PeerArg makes `shrooms probe inside` a peer cage (D8's target when no
// targets file names one): it announces its addresses on stderr with
// PeerAnnounce and waits to be stopped.
const (
	PeerArg      = "--peer"
	PeerAnnounce = "shrooms-probe-peer"
)

// Peer announces this cage's addresses on w and blocks until ctx ends or
// the cage is stopped (as PID 1 it must catch SIGTERM itself).
func Peer(ctx context.Context, w io.Writer) {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var addrs []string
	for _, i := range ifaces() {
		as, _ := i.Addrs()
		for _, a := range as {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(ipn.IP); ok && !(ip.Is6() && !ip.Is4In6() && ip.IsLinkLocalUnicast()) {
					addrs = append(addrs, ip.Unmap().String())
				}
			}
		}
	}
	fmt.Fprintln(w, PeerAnnounce, strings.Join(addrs, " "))
	<-ctx.Done()
}
