package probedrive

import (
	"strconv"
	"strings"
	"sync"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/probe"
)

// TestLastJSON: the report is the last line of the cage's stdout that is
// a JSON object, whatever the agent's image printed before it.
func TestLastJSON(t *testing.T) {
	out := "banner\n{\"schema\": 0}\nnoise\n  {\"schema\": 1}\n\n"
	assert.Equal(t, string(lastJSON([]byte(out))), "  {\"schema\": 1}")
	assert.Equal(t, string(lastJSON([]byte("no report"))), "no report")
}

// TestAnnounceWriter: the cage's stderr is passed on whole, each D15
// announce (split across writes) reaches OnInbound once with its address
// and port, and the tail keeps the last 4 KiB for an error message.
func TestAnnounceWriter(t *testing.T) {
	var next strings.Builder
	var mu sync.Mutex
	var got []string
	a := &announceWriter{next: &next, on: func(addr string, port int) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, addr+":"+strconv.Itoa(port))
	}}
	line := probe.InboundAnnounce + " 10.88.0.5 18085\n"
	for _, part := range []string{"warming up\n" + line[:10], line[10:], "done\n"} {
		n, err := a.Write([]byte(part))
		assert.NilError(t, err)
		assert.Equal(t, n, len(part))
	}
	a.wait()
	assert.DeepEqual(t, got, []string{"10.88.0.5:18085"})
	assert.Equal(t, next.String(), "warming up\n"+line+"done\n")
	a.Write([]byte(strings.Repeat("x", 5000)))
	assert.Equal(t, len(a.tail()), 4096)
}
