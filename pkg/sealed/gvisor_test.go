package sealed

import (
	"testing"

	"gotest.tools/v3/assert"
)

// The measured points (docs/gvisor.md): pids 128 carries 48 processes
// before the Sentry panics, pids 1024 with nproc 448 fails the flood's fork
// inside; a smaller configured nproc is kept.
func TestGVisorNproc(t *testing.T) {
	assert.Equal(t, GVisorNproc(128, 256), int64(28))
	assert.Equal(t, GVisorNproc(1024, 2048), int64(448))
	assert.Equal(t, GVisorNproc(1024, 100), int64(100))
	assert.Equal(t, GVisorNproc(16, 16), int64(1))
}
