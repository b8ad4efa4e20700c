// Command tiocsti is run with a terminal by the seccomp tests: it tries to
// push a byte into its terminal's input queue with TIOCSTI, once with the
// plain request and once with the upper 32 bits set (the kernel ignores
// them, seccomp sees them), then reads the window size to show that other
// terminal ioctls still work. One line per call.
package main

import (
	"fmt"
	"syscall"
	"unsafe"
)

const tiocsti = 0x5412

func main() {
	c := byte('X')
	for _, req := range []uint64{tiocsti, 0xffffffff00000000 | tiocsti} {
		_, _, e := syscall.Syscall(syscall.SYS_IOCTL, 0, uintptr(req), uintptr(unsafe.Pointer(&c)))
		if e != 0 {
			fmt.Printf("TIOCSTI %#x: %v\n", req, e)
		} else {
			fmt.Printf("TIOCSTI %#x: injected\n", req)
		}
	}
	var ws [4]uint16
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TIOCGWINSZ, uintptr(unsafe.Pointer(&ws))); e != 0 {
		fmt.Printf("TIOCGWINSZ: %v\n", e)
	} else {
		fmt.Println("TIOCGWINSZ: ok")
	}
}
