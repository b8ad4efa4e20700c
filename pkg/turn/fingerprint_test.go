package turn

import (
	"context"
	"errors"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/homereset"
)

// racyHost answers racy ("") fingerprints before a real one.
type racyHost struct {
	Host
	racy  int
	calls int
	err   error
}

func (h *racyHost) HomeFingerprint(context.Context, homereset.Task) (string, error) {
	h.calls++
	if h.err != nil {
		return "", h.err
	}
	if h.calls <= h.racy {
		return "", nil
	}
	return "fp1:settled", nil
}

// A racy fingerprint at preparation is taken again once the racy window
// has passed: without one the turn would fall back to the dry run, which
// passes over a HOME holding only the reset's output (baseline files).
func TestStableFingerprint(t *testing.T) {
	for _, tc := range []struct {
		racy, calls int
		want        string
	}{
		{racy: 0, calls: 1, want: "fp1:settled"},
		{racy: 2, calls: 3, want: "fp1:settled"},
		// A HOME that keeps changing keeps no fingerprint: the dry run decides.
		{racy: 100, calls: fingerprintTries, want: ""},
	} {
		h := &racyHost{racy: tc.racy}
		r := &Runner{Host: h}
		fp, err := r.stableFingerprint(context.Background(), homereset.Task{})
		assert.NilError(t, err)
		assert.Equal(t, fp, tc.want)
		assert.Equal(t, h.calls, tc.calls)
	}
	h := &racyHost{err: errors.New("stat: EIO")}
	_, err := (&Runner{Host: h}).stableFingerprint(context.Background(), homereset.Task{})
	assert.ErrorContains(t, err, "EIO")
	assert.Equal(t, h.calls, 1)
}
