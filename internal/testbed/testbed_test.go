package testbed

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestTopology proves the testbed itself: it is isolated (New checks), its
// canaries log a hit with the nonce from a peer namespace (positive
// control), and a probe to an address outside it is refused by the kernel.
func TestTopology(t *testing.T) {
	itest.Require(t, itest.Root, itest.Netns, itest.Nftables)
	tb := New(t)
	out, err := tb.Exec("host", "sh", "-c", "echo tbnonce-1 | busybox nc -w 2 203.0.113.10 80")
	assert.NilError(t, err, string(out))
	assert.Assert(t, strings.Contains(string(out), "canary internet"), string(out))
	hits := tb.Hits("tbnonce-1")
	assert.Equal(t, len(hits), 1)
	assert.Equal(t, hits[0].NS, "internet")
	assert.Equal(t, hits[0].Local.Addr(), InternetAddr4)

	out, err = tb.Exec("host", "sh", "-c", "echo tbnonce-2 | busybox nc -w 2 fd00:ec2::254 80")
	assert.NilError(t, err, string(out))
	assert.Equal(t, len(tb.Hits("tbnonce-2")), 1)

	out, err = tb.Exec("internet", "busybox", "nc", "-w", "1", "8.8.8.8", "53")
	assert.Assert(t, err != nil, "internet namespace reached 8.8.8.8: %s", out)
	assert.Assert(t, strings.Contains(string(out), "unreachable"), string(out))
}

func TestIPv4OnlyInternet(t *testing.T) {
	tb := New(t, IPv4OnlyInternet())
	out, err := tb.Exec("host", "sh", "-c", "echo tbv4-1 | busybox nc -w 2 "+InternetAddr4.String()+" 80")
	assert.NilError(t, err, string(out))
	assert.Equal(t, len(tb.Hits("tbv4-1")), 1, "positive control: the internet over IPv4")
	out, err = tb.Exec("internet", "ip", "-6", "addr", "show", "scope", "global")
	assert.NilError(t, err, string(out))
	assert.Equal(t, strings.TrimSpace(string(out)), "", "the internet has IPv6 addresses")
	out, err = tb.Exec("host", "ip", "route", "get", InternetAddr6.String())
	assert.Assert(t, err != nil && strings.Contains(string(out), "unreachable"), "the host routes IPv6 to the internet: %s", out)
	// The LAN keeps its IPv6.
	out, err = tb.Exec("host", "sh", "-c", "echo tbv4-2 | busybox nc -w 2 fd00:ec2::254 80")
	assert.NilError(t, err, string(out))
	assert.Equal(t, len(tb.Hits("tbv4-2")), 1)
}

// TestSharedServiceUnaffected: a running testbed cage, whose network
// namespace is mounted only in the testbed's mount namespace, must not make
// the machine's podman service fail listings and removals (podman 4.3
// joins every running container's netns it has in its database:
// podman#16140 "unknown FS magic"). The testbed's store is its own, so the
// machine's service never sees the cage.
func TestSharedServiceUnaffected(t *testing.T) {
	itest.Require(t, itest.Root, itest.Netns, itest.Nftables, itest.Podman)
	tb := New(t)
	tb.StartPodman()
	net := "stbnet-" + tb.ID
	tb.MustPodman("network", "create", "--internal", "--label", tb.Label(), net)
	id := strings.TrimSpace(tb.MustPodman("run", "-d", "--label", tb.Label(), "--network", net, itest.TestImage, "sleep", "300"))
	// Precondition (what made the machine's service fail): the cage runs
	// with a netns bind mount that this mount namespace does not have.
	key := strings.TrimSpace(tb.MustPodman("inspect", "--format", "{{.NetworkSettings.SandboxKey}}", id))
	assert.Assert(t, strings.HasPrefix(key, "/run/netns/"), "sandbox key %q", key)
	var st unix.Statfs_t
	if err := unix.Statfs(key, &st); err == nil {
		assert.Assert(t, st.Type != unix.NSFS_MAGIC, "%s is a namespace here too: the test proves nothing", key)
	}
	assert.Assert(t, strings.Contains(tb.MustPodman("ps", "--format", "{{.ID}}"), id[:12]), "the cage is not running")

	shared := func(args ...string) (string, error) {
		out, err := exec.Command("podman", append([]string{"--url", itest.Socket()}, args...)...).CombinedOutput()
		return string(out), err
	}
	// A container on the machine's service, removed there while the
	// testbed cage runs.
	name := itest.UniqueName("stb-shared-")
	out, err := shared("create", "--name", name, "--network", "none", itest.TestImage, "true")
	assert.NilError(t, err, out)
	for i := 0; i < 5; i++ {
		out, err := shared("ps", "-a", "--format", "{{.ID}}")
		// Other tests' cages may fail a listing (their netns teardown);
		// the testbed's cage never may, and is never listed.
		assert.Assert(t, !strings.Contains(out, id[:12]), "the machine's service sees the testbed cage (err %v): %s", err, out)
		out, err = shared("ps", "-a", "--filter", "name="+name, "--format", "{{.Names}}")
		assert.Assert(t, err == nil || !strings.Contains(out, id[:12]), "listing on the machine's service failed on the testbed cage: %s", out)
		if err == nil {
			assert.Equal(t, strings.TrimSpace(out), name)
		}
	}
	// A removal syncs every container of the service: others' teardowns
	// may fail it for a moment (retried), the testbed cage never may.
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		out, err = shared("rm", "-f", "-t", "0", name)
		assert.Assert(t, !strings.Contains(out, id), "removal on the machine's service failed on the testbed cage: %s", out)
		if err == nil || !strings.Contains(out, "unknown FS magic") || time.Since(start) > 30*time.Second {
			break
		}
	}
	assert.NilError(t, err, out)
}
