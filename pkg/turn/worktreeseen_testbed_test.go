package turn

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// TestIdmapWorktreeSeenInTestbed: the testbed's podman service runs in a
// mount namespace of its own (found from the socket's peer and joined for
// the staging mount); on a networked cage, walled before its start, the
// worktree check passes there and the agent writes the worktree as the
// owner (the positive control across namespaces). Its own mount namespace
// differs from the test's: the staging could not work without the join.
func TestIdmapWorktreeSeenInTestbed(t *testing.T) {
	itest.Require(t, itest.Root)
	e, r := newResolverEnv(t, "allowlist", []string{"example.test"}, nil)
	wt := idmapTree(t, e.Env, r)
	var out, errb bytes.Buffer
	res, err := r.Run(context.Background(), Request{
		Task: taskid.Must(e.Net + "-wt"), Agent: "shell", Worktree: wt,
		Args:    []string{"-c", "echo made > /work/made.txt; stat -c %u /work/made.txt; cat /proc/self/mountinfo | grep ' /work '"},
		Streams: podman.Streams{Stdout: &out, Stderr: &errb},
	})
	assert.NilError(t, err, errb.String())
	assert.Equal(t, res.ExitCode, 0, out.String()+errb.String())
	assert.Assert(t, res.Worktree.Idmapped && res.CageWall != nil)
	assert.Assert(t, strings.HasPrefix(out.String(), "1000\n"), out.String())
	assert.Assert(t, strings.Contains(out.String(), "idmapped"), out.String())
	var phases []string
	for _, p := range res.Phases {
		phases = append(phases, p.Name)
	}
	assert.Assert(t, strings.Contains(strings.Join(phases, " "), "wall worktree-seen"), "%v", phases)
	assert.Equal(t, uidOf(t, wt+"/made.txt"), uint32(4242))

	pid, err := servicePid(e.TB.PodmanURL)
	assert.NilError(t, err)
	theirs, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	ours, _ := os.Readlink("/proc/self/ns/mnt")
	assert.Assert(t, theirs != ours, "the testbed's service shares the test's mount namespace (%s)", ours)
}

// servicePid is the pid of the process listening on the unix:// socket.
func servicePid(url string) (int, error) {
	conn, err := net.Dial("unix", strings.TrimPrefix(url, "unix://"))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	f, err := conn.(*net.UnixConn).File()
	if err != nil {
		return 0, err
	}
	defer f.Close()
	cred, err := unix.GetsockoptUcred(int(f.Fd()), unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return 0, err
	}
	return int(cred.Pid), nil
}
