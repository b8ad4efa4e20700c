package worktree

import (
	"errors"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/wtcap"
)

// TestUncappedWorktreeIsRefusedByDefault: a worktree on a filesystem
// without project quotas stops the turn before its cage starts, with the
// reason and the two ways out; worktree.uncapped = "allow" lets it run.
func TestUncappedWorktreeIsRefusedByDefault(t *testing.T) {
	dir := t.TempDir()
	s, err := wtcap.Probe(dir)
	assert.NilError(t, err)
	assert.Assert(t, !s.OK, "the test's temporary directory has project quotas: this test needs one without")
	cfg := config.Default().Worktree
	assert.Equal(t, cfg.Uncapped, "refuse", "the default is safe")
	err = capWorktree(cfg, dir, taskstate.IDs{UID: 200000, GID: 200000})
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.Assert(t, strings.Contains(err.Error(), s.Reason) && strings.Contains(err.Error(), `worktree.uncapped = "allow"`), err.Error())
	cfg.Uncapped = "allow"
	assert.NilError(t, capWorktree(cfg, dir, taskstate.IDs{UID: 200000, GID: 200000}))
}
