package firewall

import (
	"os/exec"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestPinBridgeMAC: an unpinned bridge takes the lowest MAC of its ports
// (positive control: a lower port changes it); once pinned it keeps its
// address when a port with a lower MAC joins.
func TestPinBridgeMAC(t *testing.T) {
	itest.Require(t, itest.Root, itest.Netns)
	ns := itest.UniqueName("pbm")
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
		assert.NilError(t, err, string(out))
		return string(out)
	}
	out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput()
	assert.NilError(t, err, string(out))
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	mac := func() string {
		b, err := exec.Command("ip", "-n", ns, "-br", "link", "show", "br0").CombinedOutput()
		assert.NilError(t, err, string(b))
		return strings.Fields(string(b))[2]
	}
	run("link", "add", "br0", "type", "bridge")
	run("link", "add", "p1", "address", "02:00:00:00:00:50", "type", "veth", "peer", "name", "q1")
	run("link", "set", "p1", "master", "br0")
	run("link", "set", "br0", "up")
	assert.Equal(t, mac(), "02:00:00:00:00:50")
	run("link", "add", "p2", "address", "02:00:00:00:00:40", "type", "veth", "peer", "name", "q2")
	run("link", "set", "p2", "master", "br0")
	assert.Equal(t, mac(), "02:00:00:00:00:40", "positive control: an unpinned bridge follows its lowest port")

	opts := Options{NetNS: "/run/netns/" + ns}
	assert.NilError(t, PinBridgeMAC("br0", opts))
	assert.NilError(t, PinBridgeMAC("br0", opts), "pinning twice is fine")
	run("link", "add", "p3", "address", "02:00:00:00:00:30", "type", "veth", "peer", "name", "q3")
	run("link", "set", "p3", "master", "br0")
	assert.Equal(t, mac(), "02:00:00:00:00:40", "a pinned bridge keeps its address")
	assert.NilError(t, PinBridgeMAC("nosuchbridge", opts), "a bridge that does not exist yet is not an error")
}
