package sealed

import (
	"testing"

	"gotest.tools/v3/assert"
)

// Only a managed cage labelled with this state directory is ours: gc and
// leftover removal must never touch another shrooms' cages.
func TestOursNeedsManagedAndThisStateDir(t *testing.T) {
	mine := map[string]string{LabelManaged: "1", LabelState: StateLabel("/var/lib/shrooms/")}
	assert.Assert(t, Ours("/var/lib/shrooms", mine), "the cleaned state dir is the same one")
	assert.Assert(t, !Ours("/var/lib/other", mine))
	assert.Assert(t, !Ours("/var/lib/shrooms", map[string]string{LabelState: StateLabel("/var/lib/shrooms")}), "not managed")
	assert.Assert(t, !Ours("/var/lib/shrooms", nil))
}
