package firewall

import (
	"fmt"
	"net"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PinBridgeMAC fixes the cage bridge's MAC address to the one it has now.
// A Linux bridge whose address was never set takes the lowest MAC of its
// ports, so a new cage joining with a lower MAC changes the gateway's
// address under the cages already running, and their packets are dropped
// until their neighbour entries expire. netavark does not set one; an
// address set explicitly (even to the same value) is kept by the kernel, so
// setting it again is harmless. A missing bridge (no cage
// has started yet) is not an error: the next turn pins it.
func PinBridgeMAC(bridge string, opts Options) error {
	return inNetNS(opts.NetNS, func() error {
		// Netlink, not /sys: sysfs shows the namespace it was mounted in.
		ifc, err := net.InterfaceByName(bridge)
		if err != nil {
			if strings.Contains(err.Error(), "no such network interface") {
				return nil
			}
			return fmt.Errorf("bridge %s: %w", bridge, err)
		}
		if len(ifc.HardwareAddr) != 6 {
			return fmt.Errorf("bridge %s has no Ethernet address", bridge)
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("pin bridge %s address: %w", bridge, err)
		}
		defer unix.Close(fd)
		// struct ifreq { char name[16]; struct sockaddr hwaddr; }
		var req struct {
			name   [unix.IFNAMSIZ]byte
			family uint16
			data   [14]byte
			_      [8]byte
		}
		copy(req.name[:], bridge)
		req.family = unix.ARPHRD_ETHER
		copy(req.data[:], ifc.HardwareAddr)
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCSIFHWADDR, uintptr(unsafe.Pointer(&req))); errno != 0 {
			return fmt.Errorf("pin bridge %s address: %w", bridge, errno)
		}
		return nil
	})
}
