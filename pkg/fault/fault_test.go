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

func TestDefault(t *testing.T) {
	assert.Assert(t, Default(HostNotReady, nil) == nil)
	cause := errors.New("read state")
	err := Default(HostNotReady, fmt.Errorf("status: %w", cause))
	assert.Equal(t, Of(err), HostNotReady, "no kind yet: the phase's")
	assert.Assert(t, errors.Is(err, cause))
	assert.Equal(t, err.Error(), "host not ready: status: read state")
	kinded := fmt.Errorf("commit: %w", Wrap(Input, cause))
	assert.Equal(t, Default(HostNotReady, kinded), kinded, "a callee's kind stays, and its message")
	busy := fmt.Errorf("%w: task %q", Busy, "t1")
	assert.Equal(t, Default(HostNotReady, busy), busy)
}

func TestPhase(t *testing.T) {
	phase := func(fail error) (err error) {
		defer Phase(HostNotReady, &err)
		return fail
	}
	assert.NilError(t, phase(nil))
	assert.Equal(t, Of(phase(errors.New("x"))), HostNotReady)
	assert.Equal(t, phase(errors.New("x")).Error(), "host not ready: x")
	assert.Equal(t, Of(phase(Wrap(Limit, errors.New("x")))), Limit)
}
