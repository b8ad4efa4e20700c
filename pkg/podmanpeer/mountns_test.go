package podmanpeer

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestInMountNSLeavesTheProcessWhereItWas: fn runs in the other
// namespace, and however many times it does, the process's own (the main
// thread's, /proc/self) stays where it was: a joined thread that happened
// to be the main one would be kept by the runtime in the joined namespace.
func TestInMountNSLeavesTheProcessWhereItWas(t *testing.T) {
	itest.Require(t, itest.Root)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "60")
	assert.NilError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	self, err := os.Readlink("/proc/self/ns/mnt")
	assert.NilError(t, err)
	var theirs string
	for i := 0; i < 100; i++ {
		if theirs, err = os.Readlink("/proc/" + itoa(cmd.Process.Pid) + "/ns/mnt"); err == nil && theirs != self {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	assert.Assert(t, theirs != self, "positive control: the other process has a namespace of its own")
	for i := 0; i < 200; i++ {
		var in string
		assert.NilError(t, InMountNS(cmd.Process.Pid, func() error {
			var err error
			in, err = os.Readlink("/proc/thread-self/ns/mnt")
			return err
		}))
		assert.Equal(t, in, theirs, "fn did not run in the other namespace")
		now, err := os.Readlink("/proc/self/ns/mnt")
		assert.NilError(t, err)
		assert.Equal(t, now, self, "call %d left the main thread in the other namespace", i)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
