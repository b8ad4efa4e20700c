package main

import (
	"errors"
	"fmt"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// TestCodeForIsByKind: exit codes follow the error's kind through any
// wrapping, whatever its text says.
func TestCodeForIsByKind(t *testing.T) {
	for _, c := range []struct {
		err  error
		code int
	}{
		{fault.Wrap(fault.Input, errors.New("host not ready")), ExitUsage},
		{fmt.Errorf("run: %w", fault.Wrap(fault.HostNotReady, errors.New("bad input"))), ExitHostNotReady},
		{fmt.Errorf("%w: task t", taskstate.ErrBusy), ExitBusy},
		{turn.ErrDeadline, ExitDeadline},
		{fmt.Errorf("%w: 10 requests", turn.ErrLimit), ExitLimit},
		{fault.Wrap(fault.Interrupted, errors.New("signal")), ExitInterrupted},
		{errors.New("bad input: looks like a kind, is not one"), ExitInternal},
		{fault.Wrap(fault.Internal, errors.New("x")), ExitInternal},
		{errors.Join(errors.New("a"), fault.Wrap(fault.Deadline, errors.New("b"))), ExitDeadline},
		// The outermost kind decides; the cause's kind is kept but second.
		{fmt.Errorf("%w: %w", turn.ErrHostNotReady, fault.Wrap(fault.Input, errors.New("x"))), ExitHostNotReady},
		{fmt.Errorf("%w: %w", turn.ErrInput, fmt.Errorf("%w: y", taskstate.ErrBusy)), ExitUsage},
	} {
		assert.Equal(t, codeFor(c.err), c.code, "%v", c.err)
	}
}
