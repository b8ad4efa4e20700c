package podmanpeer

import (
	"testing"

	"gotest.tools/v3/assert"
)

func TestParse(t *testing.T) {
	var s Service
	ok := parse([]string{"/usr/bin/podman", "--log-level", "info", "--runtime", "/r/runsc", "--runtime-flag", "platform=systrap", "--runtime-flag=oci-seccomp", "system", "service", "--time=0", "unix:///x"}, &s)
	assert.Assert(t, ok)
	assert.Equal(t, s.Runtime, "/r/runsc")
	assert.DeepEqual(t, s.RuntimeFlags, []string{"platform=systrap", "oci-seccomp"})

	for _, args := range [][]string{
		{"/lib/systemd/systemd", "--system"},
		{"/usr/bin/podman", "run", "x"},
		{"ssh", "-L", "/x:/run/podman/podman.sock", "host"},
		{"/usr/bin/podman", "--runtime-flag"},
	} {
		var s Service
		assert.Check(t, !parse(args, &s), "%q", args)
	}
}
