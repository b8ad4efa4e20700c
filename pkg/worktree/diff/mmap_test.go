package diff

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
)

// TestMain runs this test binary as mmapWriter's or busyWrite's child when
// asked.
func TestMain(m *testing.M) {
	if p := os.Getenv(mmapWriterEnv); p != "" {
		if err := mmapWrite(p, os.Getenv(mmapWriterEnv+"_INFLIGHT") != ""); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if a := os.Getenv(busyWriterEnv); a != "" {
		if err := busyWriteMain(a); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const mmapWriterEnv = "SHROOMS_DIFF_MMAP_WRITE"

// mmapWrite changes p's first byte through a shared mapping (no write, no
// modify event) and exits; inflight first sends the file, with the
// socket's own end, into that socket: a cycle no process holds, whose
// files the kernel closes only at a later unix garbage collection — the
// close event comes then, not when the writer exits.
func mmapWrite(p string, inflight bool) error {
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

// A turn's write through a shared mapping is in the report, even when the
// file's last close (the only event it makes) comes after the turn.
func TestWatcherSeesMappedWrites(t *testing.T) {
	for _, inflight := range []bool{false, true} {
		t.Run(fmt.Sprint("inflight ", inflight), func(t *testing.T) {
			root := tree(t)
			// A coarse mtime tick apart from the tree's writes.
			time.Sleep(20 * time.Millisecond)
			w, before := watched(t, root)
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), mmapWriterEnv+"="+filepath.Join(root, "main.go"))
			if inflight {
				cmd.Env = append(cmd.Env, mmapWriterEnv+"_INFLIGHT=1")
			}
			out, err := cmd.CombinedOutput()
			assert.NilError(t, err, string(out))
			data, err := os.ReadFile(filepath.Join(root, "main.go"))
			assert.NilError(t, err)
			assert.Equal(t, string(data[:1]), "Z") // the control: it wrote
			s := sameAsScan(t, root, w, before)
			assert.Equal(t, s.Modified, 1)
		})
	}
}
