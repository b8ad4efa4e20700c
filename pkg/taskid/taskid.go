// Package taskid is the task id: parsed once, where it enters shrooms (the
// CLI, a state directory entry, a label), and passed on as an ID, so the
// packages below need not check it again.
package taskid

import (
	"errors"
	"fmt"

	"github.com/shrooms-cage/shrooms/internal/lazyre"
)

// ID is a valid task id: [a-z0-9][a-z0-9_.-]{0,62}, so it is safe as a
// volume name suffix, a directory name and a label value. Only Parse (and
// Must) make one: a conversion cannot forge it. The zero ID is no task;
// code that gets one fails closed (IsZero).
type ID struct{ s string }

// ErrInvalid is a string that is no task id.
var ErrInvalid = errors.New("invalid task id")

var pattern = lazyre.New(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// Parse returns s as an ID, or an error wrapping ErrInvalid.
func Parse(s string) (ID, error) {
	if !pattern().MatchString(s) {
		return ID{}, fmt.Errorf("%w %q: use 1-63 of a-z 0-9 _ . - starting with a letter or digit", ErrInvalid, truncate(s, 80))
	}
	return ID{s}, nil
}

// Must is Parse for ids known to be valid (tests, constants); it panics on
// an invalid one.
func Must(s string) ID {
	id, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return id
}

// Valid reports whether s is a task id.
func Valid(s string) bool { return pattern().MatchString(s) }

// String is the id ("" for the zero ID).
func (id ID) String() string { return id.s }

// IsZero reports whether id is the zero ID, no task.
func (id ID) IsZero() bool { return id.s == "" }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
