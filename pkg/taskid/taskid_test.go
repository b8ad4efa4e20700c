package taskid

import (
	"errors"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func TestParse(t *testing.T) {
	for _, ok := range []string{"a", "0", "task-1", "a.b_c", strings.Repeat("a", 63)} {
		id, err := Parse(ok)
		assert.NilError(t, err, ok)
		assert.Equal(t, id.String(), ok)
		assert.Assert(t, Valid(ok))
	}
	for _, bad := range []string{"", ".", "..", "../x", ".x", "-a", "_a", "A", "a/b", "a b", strings.Repeat("a", 64), string(make([]byte, 64)), "a\n"} {
		_, err := Parse(bad)
		assert.Assert(t, errors.Is(err, ErrInvalid), "%q: %v", bad, err)
		assert.Assert(t, !Valid(bad), bad)
	}
	assert.Assert(t, ID{}.IsZero())
	assert.Assert(t, !Must("a").IsZero())
	assert.Equal(t, Must("a"), Must("a"), "ids compare by value")
	_, err := Parse("Bad")
	assert.Error(t, err, `invalid task id "Bad": use 1-63 of a-z 0-9 _ . - starting with a letter or digit`)
}
