package cagelink

import (
	"fmt"

	"github.com/shrooms-cage/shrooms/pkg/innetns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// handleAt opens a route-netlink handle inside the network namespace at
// path ("" is the caller's). Only NETLINK_ROUTE: the library's default
// opens a socket per family, which a turn pays for nothing.
func handleAt(path string) (*netlink.Handle, error) {
	if path == "" {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return nil, fmt.Errorf("netlink: %w", err)
		}
		return h, nil
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	return h, nil
}

// inNetNS runs fn on a thread in the network namespace at path ("" where
// we are): /proc/sys/net shows the namespace of the thread that opens it.
func inNetNS(path string, fn func() error) error { return innetns.Run(path, fn) }
