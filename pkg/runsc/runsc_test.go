package runsc

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// The flags runsc writes for its sandbox process, and podman's
// --runtime-flag values, judged against shrooms' profile.
func TestParseAndJudge(t *testing.T) {
	sandbox := ParseArgs([]string{"--root=/var/run/runsc", "--network=host", "--platform=systrap", "--oci-seccomp=true", "--log-fd=3", "boot", "--bundle=/x", "--oci-seccomp=false"})
	assert.DeepEqual(t, sandbox, Flags{"root": "/var/run/runsc", "network": "host", "platform": "systrap", "oci-seccomp": "true", "log-fd": "3"})
	fail, warns := Judge(sandbox)
	assert.Equal(t, fail, "")
	assert.Equal(t, len(warns), 0)

	fail, warns = Judge(FromRuntimeFlags([]string{"platform=kvm", "oci-seccomp=false"}))
	assert.Assert(t, strings.Contains(fail, "without --oci-seccomp"), fail)
	assert.DeepEqual(t, len(warns), 2) // platform kvm, network sandbox (the default)

	fail, _ = Judge(FromRuntimeFlags([]string{"oci-seccomp", "network=host"}))
	assert.Equal(t, fail, "", "a bare bool flag is true")
	fail, _ = Judge(ParseArgs([]string{"--platform=systrap", "boot", "--oci-seccomp=true"}))
	assert.Assert(t, fail != "", "a flag after the subcommand is not runsc's global flag")

	// Go's flag package (runsc's) stops at "--" and at "-": a flag after
	// either is an argument, never runsc's setting.
	fail, _ = Judge(ParseArgs([]string{"--platform=systrap", "--", "--oci-seccomp=true"}))
	assert.Assert(t, fail != "", "a flag after -- is no flag")
	fail, _ = Judge(ParseArgs([]string{"--platform=systrap", "-", "--oci-seccomp=true"}))
	assert.Assert(t, fail != "", "a flag after - is no flag")
	fail, _ = Judge(ParseArgs([]string{"--oci-seccomp=true", "--oci-seccomp=false"}))
	assert.Assert(t, fail != "", "the last of a repeated flag counts")
	fail, _ = Judge(ParseArgs([]string{"--oci-seccomp=false", "-oci-seccomp"}))
	assert.Equal(t, fail, "", "the last of a repeated flag counts")
}
