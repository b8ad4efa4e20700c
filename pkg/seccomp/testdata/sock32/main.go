// Command sock32 is built for GOARCH=386 by the seccomp tests: a 32-bit
// process on an x86_64 host, whose socket() goes through socketcall. It
// prints one line per socket family it tries.
package main

import (
	"fmt"
	"syscall"
)

func main() {
	for _, f := range []struct {
		name     string
		fam, typ int
	}{
		{"AF_INET", syscall.AF_INET, syscall.SOCK_STREAM},
		{"AF_VSOCK", 40, syscall.SOCK_STREAM},
		{"AF_ALG", syscall.AF_ALG, 15}, // invalid type: EINVAL once past seccomp
	} {
		fd, err := syscall.Socket(f.fam, f.typ, 0)
		if err != nil {
			fmt.Printf("%s %v\n", f.name, err)
			continue
		}
		syscall.Close(fd)
		fmt.Printf("%s open\n", f.name)
	}
}
