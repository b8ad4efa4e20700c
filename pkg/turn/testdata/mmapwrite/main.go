// mmapwrite changes its argument's first byte to Z through a shared
// mapping (no write, no modify event) and, with a second argument
// "inflight", first sends the file with the socket's own end into a unix
// socket: a cycle no process holds, whose files the kernel closes only at
// a later unix garbage collection, after the writer (and its cage) ended.
package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

func main() {
	if err := run(os.Args[1], len(os.Args) > 2 && os.Args[2] == "inflight"); err != nil {
		fmt.Fprintln(os.Stderr, "mmapwrite:", err)
		os.Exit(1)
	}
}

func run(p string, inflight bool) error {
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	m, err := unix.Mmap(fd, 0, 1, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	if inflight {
		sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		if err := unix.Sendmsg(sp[0], []byte("x"), unix.UnixRights(fd, sp[1]), nil, 0); err != nil {
			return err
		}
	}
	unix.Close(fd)
	m[0] = 'Z'
	return nil
}
