package fault

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"gotest.tools/v3/assert"
)

func TestWrapKeepsCauseAndKind(t *testing.T) {
	cause := &fs.PathError{Op: "open", Path: "/x", Err: fs.ErrNotExist}
	err := fmt.Errorf("load: %w", Wrap(HostNotReady, cause))
	assert.Assert(t, errors.Is(err, HostNotReady))
	assert.Assert(t, !errors.Is(err, Input))
	assert.Assert(t, errors.Is(err, fs.ErrNotExist))
	var pe *fs.PathError
	assert.Assert(t, errors.As(err, &pe))
	assert.Equal(t, pe.Path, "/x")
	assert.Equal(t, Of(err), HostNotReady)
	assert.Equal(t, err.Error(), "load: host not ready: open /x: file does not exist")
}

func TestKindAsSentinel(t *testing.T) {
	// The old "%w: %v" form still carries the kind.
	err := fmt.Errorf("%w: task %q", Busy, "t1")
	assert.Assert(t, errors.Is(err, Busy))
	assert.Equal(t, Of(err), Busy)
	assert.Equal(t, err.Error(), `task is busy: task "t1"`)
}

func TestOf(t *testing.T) {
	assert.Equal(t, Of(nil), Internal)
	assert.Equal(t, Of(errors.New("x")), Internal)
	assert.Equal(t, Of(Wrap(Input, Wrap(Deadline, errors.New("x")))), Input, "the outermost kind wins")
	assert.Equal(t, Of(errors.Join(errors.New("a"), Wrap(Limit, errors.New("b")))), Limit)
	assert.Assert(t, Wrap(Input, nil) == nil)
	assert.Equal(t, Wrapf(Interrupted, "turn %d: %w", 3, errors.New("signal")).Error(), "interrupted: turn 3: signal")
}
