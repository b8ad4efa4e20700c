package cagelink

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// A real cage as the shrooms driver has it: podman, --network none, a user
// namespace (so runc makes the netns, owned by the cage). Its link's host
// end sits in the test's host namespace, never the machine's.
func TestAttachAPodmanCage(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	w := newWorld(t, sub4, sub6)
	w.ensure()
	name := itest.UniqueName("cagelink")
	podman := func(args ...string) (string, error) {
		out, err := exec.Command("podman", append([]string{"--url", itest.Socket()}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	out, err := podman("run", "-d", "--rm", "--name", name, "--network", "none",
		"--uidmap", "0:3100000:65536", "--gidmap", "0:3100000:65536", "--cap-drop", "ALL",
		itest.TestImage, "sleep", "600")
	assert.NilError(t, err, out)
	t.Cleanup(func() { _, _ = podman("rm", "-f", "-t", "0", name) })
	out, err = podman("inspect", "-f", "{{.State.Pid}}", name)
	assert.NilError(t, err, out)
	pid, err := strconv.Atoi(out)
	assert.NilError(t, err, out)
	cage := fmt.Sprintf("/proc/%d/ns/net", pid)
	rt, _ := podman("inspect", "-f", "{{.OCIRuntime}}", name)
	t.Logf("cage %s: runtime %s, network namespace %s", name, rt, cage)

	ln := w.listen(w.host, w.n.Gateway4())
	nc := func() (string, error) {
		return podman("exec", name, "sh", "-c", fmt.Sprintf("echo hi | nc -w 3 %s %d", w.n.Gateway4(), port(ln)))
	}
	// Control: before Attach the cage has no way out.
	out, err = nc()
	assert.Assert(t, err != nil, "nc before Attach: %s", out)

	l := w.attach(cage)
	got, err := Check(w.n, cage)
	assert.NilError(t, err)
	assert.Equal(t, got, l)
	accepted := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- err.Error()
			return
		}
		accepted <- c.RemoteAddr().String()
		c.Close()
	}()
	out, err = nc()
	assert.NilError(t, err, out)
	select {
	case src := <-accepted:
		assert.Equal(t, src, fmt.Sprintf("%s:%s", l.Addr4, strings.Split(src, ":")[1]))
	case <-time.After(5 * time.Second):
		t.Fatal("nothing accepted")
	}

	// The cage's exit takes the link with it.
	out, err = podman("rm", "-f", "-t", "0", name)
	assert.NilError(t, err, out)
	w.waitGone(l.Host)
}

// TestMain runs TestAttachAPodmanCage under runsc too when
// SHROOMS_TEST_RUNTIME=runsc (itest.Main starts that service).
func TestMain(m *testing.M) { os.Exit(itest.Main(m)) }
