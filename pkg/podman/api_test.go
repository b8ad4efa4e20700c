package podman

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

func frame(stream byte, data string) []byte {
	h := make([]byte, 8, 8+len(data))
	h[0] = stream
	binary.BigEndian.PutUint32(h[4:], uint32(len(data)))
	return append(h, data...)
}

// TestDemux: podman's framed attach stream goes to stdout (streams 0 and
// 1) and stderr (2), frames larger than the buffer included; stream 3 is
// the service's error and ends the copy with it; an unknown stream number
// means the stream lost its framing.
func TestDemux(t *testing.T) {
	big := strings.Repeat("x", 100<<10)
	var in bytes.Buffer
	for _, f := range [][]byte{frame(1, "out1 "), frame(2, "err1 "), frame(0, "out0 "), frame(1, big), frame(2, "err2")} {
		in.Write(f)
	}
	var out, errOut bytes.Buffer
	assert.NilError(t, demux(&in, &out, &errOut))
	assert.Equal(t, out.String(), "out1 out0 "+big)
	assert.Equal(t, errOut.String(), "err1 err2")

	// A nil writer drops its stream's frames.
	in.Reset()
	in.Write(frame(1, "dropped"))
	in.Write(frame(2, "kept"))
	errOut.Reset()
	assert.NilError(t, demux(&in, nil, &errOut))
	assert.Equal(t, errOut.String(), "kept")

	in.Reset()
	in.Write(frame(3, "container gone"))
	assert.ErrorContains(t, demux(&in, &out, &errOut), "container gone")

	in.Reset()
	in.Write(frame(7, "x"))
	assert.ErrorContains(t, demux(&in, &out, &errOut), "unrecognized channel")

	// A stream cut inside a frame is an error, not a clean end.
	in.Reset()
	in.Write(frame(1, "whole")[:10])
	assert.Assert(t, errors.Is(demux(&in, &out, &errOut), io.ErrUnexpectedEOF))
}

// TestDecodeError: podman's error body becomes an error that says its
// message, and a 404 is "not found" (a missing object) while a service
// that does not answer is not.
func TestDecodeError(t *testing.T) {
	err := decodeError(http.StatusNotFound, []byte(`{"cause":"no such container","message":"no container with name or ID \"x\" found: no such container","response":404}`))
	assert.Equal(t, err.Error(), `no container with name or ID "x" found: no such container`)
	assert.Check(t, isNotFound(err))
	assert.Check(t, isNotFound(decodeError(http.StatusNotFound, nil)))
	assert.Check(t, !isNotFound(decodeError(http.StatusInternalServerError, []byte(`{"cause":"x","message":"boom","response":500}`))))
	assert.Equal(t, decodeError(http.StatusInternalServerError, []byte("plain text\n")).Error(), "plain text")
	assert.Equal(t, decodeError(http.StatusConflict, nil).Error(), "Conflict")
	_, err = socketPath("tcp://127.0.0.1:1")
	assert.ErrorContains(t, err, "not a unix:///path URL")
}

// TestEndpointEscapes: a name is one path element of the URL, whatever it
// holds.
func TestEndpointEscapes(t *testing.T) {
	assert.Equal(t, endpoint(nil, "images", "localhost/x:latest", "exists"), "http://d/v"+apiVersion+"/libpod/images/localhost%2Fx:latest/exists")
	assert.Equal(t, endpoint(map[string][]string{"condition": {"exited", "stopped"}}, "containers", "a b", "wait"),
		"http://d/v"+apiVersion+"/libpod/containers/a%20b/wait?condition=exited&condition=stopped")
}

// TestAttachLeavesNoSocket: each attach dials a connection of its own,
// which podman hijacks; once the stream ends it is closed, so a
// long-lived process (soak, kube sandbox) keeps no socket per turn.
func TestAttachLeavesNoSocket(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman)
	client, err := Connect(context.Background(), itest.Socket())
	assert.NilError(t, err)
	before := openSockets(t)
	for i := 0; i < 3; i++ {
		var out itest.Buffer
		id, ended := startCage(t, client, "echo hi; echo oops >&2", &out)
		code, err := client.Follow(context.Background(), id, Streams{Stdout: &out}, ended)
		assert.NilError(t, err)
		assert.Equal(t, code, int32(0))
		assert.Check(t, is.Contains(out.String(), "hi\n"))
	}
	client.http.CloseIdleConnections()
	after := openSockets(t)
	assert.Check(t, after <= before, "sockets open: %d before three attached turns, %d after", before, after)
}

func openSockets(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	assert.NilError(t, err)
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}
