package home

import (
	"errors"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// KeptProfiles keeps what the task used besides the turn's own profiles,
// and refuses a profiles fact naming no profile (HostNotReady: the state
// is wrong, not the input).
func TestKeptProfilesFromTheTasksFact(t *testing.T) {
	cfg := config.Default()
	st := taskstate.Store{Dir: t.TempDir()}
	id := taskid.Must("t1")
	dir, err := st.Task(id)
	assert.NilError(t, err)
	kept, err := KeptProfiles(cfg, dir, []string{"claude"})
	assert.NilError(t, err)
	assert.Assert(t, len(kept) == 0, "a new task keeps nothing: %v", kept)

	assert.NilError(t, st.Remember(id, taskstate.FactProfiles, "claude,opencode,shell"))
	kept, err = KeptProfiles(cfg, dir, []string{"claude", "shell"})
	assert.NilError(t, err)
	assert.DeepEqual(t, kept, []string{"opencode"})

	assert.NilError(t, st.Remember(id, taskstate.FactProfiles, "claude,nosuch"))
	_, err = KeptProfiles(cfg, dir, []string{"claude"})
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.ErrorContains(t, err, `task t1's profiles fact names "nosuch", which is no HOME profile`)
}

func TestTaskOfGivesTheAgentTheTasksIDs(t *testing.T) {
	cfg := config.Default()
	ids := taskstate.IDs{UID: 100000, GID: 200000}
	got := TaskOf(cfg, "/r", ids, []string{"claude"}, []string{"opencode"})
	assert.Equal(t, got.UID, 100000+int(cfg.Cage.User))
	assert.Equal(t, got.GID, 200000+int(cfg.Cage.User))
	assert.Equal(t, got.Root, "/r")
	assert.DeepEqual(t, got.Kept, []string{"opencode"})
}
