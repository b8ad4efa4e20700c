package turn

import (
	"context"
	"errors"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/fault"
)

// TestRunReportsTheImageTheCageWasCreatedFrom: the image's name was
// pointed elsewhere between the check and the create; the result names the
// image the cage was created from (and its digest), not the checked one.
func TestRunReportsTheImageTheCageWasCreatedFrom(t *testing.T) {
	e := newPipeEngine()
	e.createdImage = strings.Repeat("ef", 32)
	r, _ := pipeRunner(t, e)
	res, err := r.Run(context.Background(), claudeReq())
	assert.NilError(t, err)
	assert.Equal(t, res.Image.ID, e.createdImage)
	assert.Equal(t, res.Image.Name, r.Cfg.ImageFor(r.Cfg.Agents["claude"]))
	assert.Equal(t, res.Image.Digest, "sha256:"+strings.Repeat("cd", 32))

	// Control: created from the checked image, the result names it.
	e = newPipeEngine()
	r, _ = pipeRunner(t, e)
	res, err = r.Run(context.Background(), claudeReq())
	assert.NilError(t, err)
	assert.Equal(t, res.Image.ID, strings.Repeat("ab", 32))
}

// TestRunRefusesACageOfUnknownImage: when podman does not say which image
// a cage was created from, it does not start.
func TestRunRefusesACageOfUnknownImage(t *testing.T) {
	e := newPipeEngine()
	e.createdImage = "-"
	r, _ := pipeRunner(t, e)
	res, err := r.Run(context.Background(), claudeReq())
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.ErrorContains(t, err, "which image")
	assert.Equal(t, e.called("start"), 0)
	assert.Equal(t, len(e.cages), 0, "the cage is removed")
	assert.Equal(t, res.Status, "error")
	assertNoSecrets(t, e, true)
}
