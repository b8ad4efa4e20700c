package podman

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// ErrCageGone marks a cage that podman no longer knows: it was removed
// behind shrooms' back (typically while the podman service was away), so its
// exit code is lost.
var ErrCageGone = errors.New("cage is gone")

// Backoff bounds of the reconnection to a podman service that went away.
const (
	reconnectFirst = 50 * time.Millisecond
	reconnectMax   = 2 * time.Second
)

// Follow waits for a started cage to exit and returns its exit code, riding
// through a restart of the podman service: attached is the stream Start
// returned. When the stream ends, the cage's state is read; a service that
// does not answer is retried with backoff until ctx ends (the turn's
// deadline), and a cage that still runs once the service answers again is
// re-attached (stdout and stderr; stdin is not re-attached, since the first
// attachment's copier may still hold the reader). What the cage printed while
// no one was attached is lost: the cage logs nowhere (log driver none) and
// conmon drops output that has no attached reader. A cage that disappeared
// returns ErrCageGone.
func (c *Client) Follow(ctx context.Context, id string, st Streams, attached <-chan error) (int32, error) {
	reattached := Streams{Stdout: st.Stdout, Stderr: st.Stderr, TTY: st.TTY}
	for {
		select {
		case <-attached:
		case <-ctx.Done():
			return -1, ctx.Err()
		}
		// The stream ended: the cage exited (its exit file lands a moment
		// later), it closed its output, or the service went away.
		outage := false
		delay := reconnectFirst
		for polls := 0; ; {
			code, exited, err := c.ExitCode(ctx, id)
			switch {
			case err != nil && ctx.Err() != nil:
				return -1, ctx.Err()
			case err != nil && IsConnectionError(err):
				outage = true
				if err := sleep(ctx, delay); err != nil {
					return -1, err
				}
				delay = min(2*delay, reconnectMax)
				continue
			case err != nil && isNotFound(err):
				return -1, gone(id)
			case err != nil:
				return -1, fmt.Errorf("wait for cage: %w", err)
			case exited:
				return code, nil
			}
			// It runs. After an outage, re-attach at once so that as little
			// output as possible is dropped; otherwise give an exit in
			// flight a second before falling back to a fresh attachment
			// (which also waits for a cage that closed its output).
			if outage || polls >= 100 {
				break
			}
			polls++
			if err := sleep(ctx, 10*time.Millisecond); err != nil {
				return -1, err
			}
		}
		var err error
		attached, err = c.reattach(ctx, id, reattached)
		if err != nil {
			return -1, err
		}
	}
}

// start starts a created cage, riding through a restart of the service: a
// start that could not reach the service is followed by the cage's state
// once it answers again; a cage that runs or ran is started, one still
// waiting is started again. (Not ridden through: a service killed in the
// very moment it runs the OCI runtime's start, which leaves podman's record
// at "initialized" while the cage runs; the runtime then refuses the second
// start and the turn ends with that error, its cage removed.)
func (c *Client) start(ctx context.Context, id string) error {
	delay := reconnectFirst
	for retried := false; ; retried = true {
		err := c.do(ctx, http.MethodPost, nil, nil, nil, "containers", id, "start")
		if err != nil && retried && !IsConnectionError(err) {
			// The killed service may have run the OCI runtime's start
			// without recording it: the runtime then refuses a second one.
			if status, ierr := c.status(ctx, id); ierr == nil && !waiting(status) {
				return nil
			}
		}
		if err == nil || !IsConnectionError(err) || ctx.Err() != nil {
			return err
		}
		for {
			if sleep(ctx, delay) != nil {
				return err
			}
			delay = min(2*delay, reconnectMax)
			status, ierr := c.status(ctx, id)
			if ierr == nil {
				if !waiting(status) {
					return nil // running, or already exited: Follow reads it
				}
				break
			}
			if isNotFound(ierr) {
				return gone(id)
			}
			if !IsConnectionError(ierr) {
				return ierr
			}
		}
	}
}

// waiting reports a state in which a container has not been started.
func waiting(status string) bool {
	return status == "created" || status == "initialized" || status == "configured"
}

// status is the container's state as podman names it (created, running,
// exited, ...), synced with the OCI runtime first: a service killed in the
// middle of a start leaves its record at "created" while the cage runs.
func (c *Client) status(ctx context.Context, id string) (string, error) {
	q := url.Values{"all": {"true"}, "sync": {"true"}, "filters": {jsonString(map[string][]string{"id": {id}})}}
	list, err := c.listContainers(ctx, q)
	if err != nil {
		return "", fmt.Errorf("list cage: %w", err)
	}
	if len(list) == 0 {
		return "", fmt.Errorf("no such container %s", short(id))
	}
	return list[0].State, nil
}

// reattach attaches the streams to a running cage again, retrying while the
// service does not answer. A cage that exited in between yields a closed
// channel, so that Follow reads its exit code.
func (c *Client) reattach(ctx context.Context, id string, st Streams) (<-chan error, error) {
	delay := reconnectFirst
	for {
		ch, err := c.attach(ctx, id, st)
		switch {
		case err == nil:
			return ch, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case IsConnectionError(err):
			if err := sleep(ctx, delay); err != nil {
				return nil, err
			}
			delay = min(2*delay, reconnectMax)
		case isNotFound(err):
			return nil, gone(id)
		default:
			// Podman refuses to attach to a cage that has stopped: let
			// Follow read its state.
			done := make(chan error, 1)
			done <- err
			return done, nil
		}
	}
}

// gone says what happened to a cage podman no longer knows. Whether the
// removal fell in an outage cannot be told reliably (the service may be back
// before the first retry), so the message names the likely cause.
func gone(id string) error {
	return fmt.Errorf("%w: cage %s was removed behind shrooms' back (e.g. while the podman service was unreachable); its remaining output and exit code are lost", ErrCageGone, short(id))
}

// IsConnectionError reports whether err means the podman service did not
// answer (not running, socket gone, connection dropped) rather than that it
// answered with an error.
func IsConnectionError(err error) bool {
	if err == nil {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrUnreachable) {
		return true
	}
	// Messages flattened by oneLine lose their wrapping.
	msg := err.Error()
	for _, s := range []string{"connect: no such file or directory", "connect: connection refused", "connection reset by peer", "broken pipe", "unexpected EOF", ": EOF", "podman API unreachable"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
