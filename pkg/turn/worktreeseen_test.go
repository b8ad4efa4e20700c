package turn

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containers/podman/v5/pkg/specgen"
	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// TestIdmapUnseenWorktreeIsRefused: the staging mount made where the
// runtime does not see it (detached before the cage is created, as behind
// a socket relay) leaves the cage's /work the empty root-only staging
// directory; the turn is refused before the agent runs and its cage
// removed, for a fresh cage and for one prepared ahead; with the chown
// walks a /work that is not the worktree is refused too. The positive
// controls: the same check passes on normal turns of both modes.
func TestIdmapUnseenWorktreeIsRefused(t *testing.T) {
	e, runner := newHarness(t, "")
	wt := idmapTree(t, e, runner)
	task := e.Task("unseen")
	ctx := context.Background()
	const script = "echo AGENT-RAN"
	req := func(out *bytes.Buffer) Request {
		return Request{Task: taskid.Must(task), Agent: "shell", Worktree: wt, Args: []string{"-c", script}, Streams: podman.Streams{Stdout: out, Stderr: out}}
	}
	seen := func(res *Result) bool {
		return slices.ContainsFunc(res.Phases, func(p Phase) bool { return p.Name == "worktree-seen" })
	}

	var out bytes.Buffer
	res, err := runner.Run(ctx, req(&out))
	assert.NilError(t, err, out.String())
	assert.Assert(t, res.Worktree.Idmapped && seen(res), "positive control: the check passed on a normal turn: %+v", res.Phases)
	assert.Equal(t, out.String(), "AGENT-RAN\n")
	t.Logf("phases of the positive control: %+v", res.Phases)

	refused := func(why string) {
		t.Helper()
		out.Reset()
		res, err := runner.Run(ctx, req(&out))
		assert.ErrorContains(t, err, why)
		assert.Assert(t, !strings.Contains(out.String(), "AGENT-RAN"), "the agent ran: %s", out.String())
		assert.Assert(t, res.Cage != "", "the cage was created")
		cg, err := runner.Podman.CageNamed(ctx, res.Cage)
		assert.NilError(t, err)
		assert.Assert(t, cg == nil, "the refused cage is removed: %+v", cg)
		assert.Assert(t, !staged(t, runner, task))
		assert.Equal(t, uidOf(t, filepath.Join(wt, "src", "main.go")), uint32(4242), "the worktree is given back")
	}
	// The staging mount detached before the cage is created (as if made
	// in a mount namespace the runtime does not use): /work is the empty
	// directory of mode 0, which runc itself refuses to enter.
	runner.OnSpec = func(s *specgen.SpecGenerator) {
		for _, m := range s.Mounts {
			if m.Destination == "/work" {
				assert.NilError(t, runner.claims().UnstageDir(m.Source))
			}
		}
	}
	refused("permission denied")
	// The staging pointed at another, enterable, directory: the check.
	other := t.TempDir()
	assert.NilError(t, os.Chmod(other, 0o777))
	elsewhere := func(s *specgen.SpecGenerator) {
		for i, m := range s.Mounts {
			if m.Destination == "/work" {
				s.Mounts[i].Source = other
			}
		}
	}
	runner.OnSpec = elsewhere
	refused("the cage does not see the worktree " + wt + " at /work (its /work is device")
	// The worktree itself bound plainly: the right inode, not idmapped.
	other = wt
	refused("the cage does not see the worktree " + wt + " at /work (its mount is not idmapped")

	// The chown walks get the same check: a normal turn passes it (the
	// positive control), one whose /work is another directory is refused.
	runner.OnSpec = nil
	mode := runner.Cfg.Worktree.Idmap
	runner.Cfg.Worktree.Idmap = "off"
	out.Reset()
	res, err = runner.Run(ctx, req(&out))
	assert.NilError(t, err, out.String())
	assert.Assert(t, !res.Worktree.Idmapped && seen(res), "%+v", res.Phases)
	assert.Equal(t, out.String(), "AGENT-RAN\n")
	other = t.TempDir()
	assert.NilError(t, os.Chmod(other, 0o777))
	runner.OnSpec = elsewhere
	refused("the cage does not see the worktree " + wt + " at /work (its /work is device")
	runner.Cfg.Worktree.Idmap = mode

	// A cage prepared ahead on a staging mount it does not see is refused
	// at its preparation.
	runner.Binary = itest.ShroomsBinary(t)
	runner.OnSpec = elsewhere
	_, err = runner.PrepareNext(ctx, req(nil))
	assert.ErrorContains(t, err, "the cage does not see the worktree")
	runner.OnSpec = nil
	out.Reset()
	res, err = runner.Run(ctx, req(&out))
	assert.NilError(t, err, out.String())
	assert.Assert(t, !res.Prepared && seen(res))
	assert.Equal(t, out.String(), "AGENT-RAN\n")
}
