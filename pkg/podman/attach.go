package podman

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"golang.org/x/term"
)

// Streams are the process's standard streams wired to a cage. A nil Stdin
// means the cage's stdin is not attached.
type Streams struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Terminal: the cage has a terminal and Stdin and Stdout are the
	// person's (*os.File): the terminal is put in raw mode for the turn,
	// window size changes are passed on, and it is restored afterwards.
	// The cage's output then comes as one stream.
	Terminal bool
	// TTY, when set, is whether the cage was created with a terminal (the
	// spec it was created from says so): attach then needs no inspection
	// to learn whether podman frames the stream.
	TTY *bool
}

// Start attaches the streams to a created container, then starts it. It
// returns once the container runs; the returned channel yields the attach
// stream's end (nil when the output was fully copied).
func (c *Client) Start(ctx context.Context, id string, st Streams) (<-chan error, error) {
	if err := c.connected(ctx); err != nil {
		return nil, err
	}
	ended, err := c.attach(ctx, id, st)
	if err != nil {
		if IsConnectionError(err) {
			return nil, fmt.Errorf("%w at %s: %v", ErrUnreachable, c.uri, oneLine(err))
		}
		return nil, fmt.Errorf("attach to cage: %s", oneLine(err))
	}
	if err := c.start(ctx, id); err != nil {
		return nil, fmt.Errorf("start cage: %s", oneLine(err))
	}
	return ended, nil
}

// attach opens a stream from a created or running cage on a connection of
// its own (podman hijacks it) and copies it to st until it ends, ctx ends
// or the cage's output closes; the returned channel yields that end. The
// error of a failed attachment keeps its cause (for IsConnectionError and
// isNotFound).
func (c *Client) attach(ctx context.Context, id string, st Streams) (<-chan error, error) {
	// Whether podman frames the stream depends on the cage's terminal.
	var tty bool
	if st.TTY != nil {
		tty = *st.TTY
	} else {
		info, err := c.inspect(ctx, id)
		if err != nil {
			return nil, err
		}
		tty = info.Config != nil && info.Config.Tty
	}
	q := url.Values{"stream": {"true"}}
	if st.Stdin != nil {
		q.Set("stdin", "true")
	}
	if st.Stdout != nil {
		q.Set("stdout", "true")
	}
	if st.Stderr != nil {
		q.Set("stderr", "true")
	}
	// A person's terminal goes raw only when the cage has one too.
	inFile, inOK := st.Stdin.(*os.File)
	_, outOK := st.Stdout.(*os.File)
	raw := tty && inOK && outOK && term.IsTerminal(int(inFile.Fd()))

	nc, err := (&net.Dialer{}).DialContext(ctx, "unix", c.path)
	if err != nil {
		return nil, err
	}
	stopClose := context.AfterFunc(ctx, func() { _ = nc.Close() })
	fail := func(err error) (<-chan error, error) {
		stopClose()
		_ = nc.Close()
		return nil, err
	}
	req, err := http.NewRequest(http.MethodPost, endpoint(q, "containers", id, "attach"), nil)
	if err != nil {
		return fail(err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "tcp")
	if err := req.Write(nc); err != nil {
		return fail(err)
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return fail(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols && resp.StatusCode >= 300 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return fail(decodeError(resp.StatusCode, data))
	}

	var restore func()
	if raw {
		state, err := term.MakeRaw(int(inFile.Fd()))
		if err != nil {
			return fail(fmt.Errorf("terminal raw mode: %w", err))
		}
		restore = c.passResizes(ctx, id, inFile)
		restoreTerm := restore
		restore = func() { restoreTerm(); _ = term.Restore(int(inFile.Fd()), state) }
	}

	ended := make(chan error, 1)
	outDone := make(chan error, 1)
	inDone := make(chan error, 1)
	if st.Stdin != nil {
		go func() {
			_, err := io.Copy(nc, st.Stdin)
			if err == nil {
				if cw, ok := nc.(interface{ CloseWrite() error }); ok {
					_ = cw.CloseWrite()
				}
			}
			inDone <- err
		}()
	}
	go func() {
		if tty {
			out := st.Stdout
			if out == nil {
				out = io.Discard
			}
			_, err := io.Copy(out, br)
			outDone <- err
			return
		}
		outDone <- demux(br, st.Stdout, st.Stderr)
	}()
	go func() {
		var err error
		if tty {
			// With a terminal, the end of either direction ends the stream.
			select {
			case err = <-outDone:
			case err = <-inDone:
			}
		} else {
			err = <-outDone
		}
		stopClose()
		_ = nc.Close()
		if restore != nil {
			restore()
		}
		ended <- err
	}()
	return ended, nil
}

// demux copies podman's framed stream (an 8-byte header: stream number,
// three zero bytes, the frame's length big-endian) to stdout and stderr
// until it ends; a nil writer drops its frames.
func demux(r io.Reader, stdout, stderr io.Writer) error {
	var hdr [8]byte
	buf := make([]byte, 32<<10)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		n := int(binary.BigEndian.Uint32(hdr[4:]))
		if n > len(buf) {
			buf = make([]byte, n)
		}
		frame := buf[:n]
		if _, err := io.ReadFull(r, frame); err != nil {
			return err
		}
		var w io.Writer
		switch hdr[0] {
		case 0, 1:
			w = stdout
		case 2:
			w = stderr
		case 3:
			return fmt.Errorf("from service from stream: %s", frame)
		default:
			return fmt.Errorf("unrecognized channel '%d' in header, 0-3 supported", hdr[0])
		}
		if w != nil {
			if _, err := w.Write(frame); err != nil {
				return err
			}
		}
	}
}

// passResizes gives the cage's terminal the person's size now and on every
// SIGWINCH until the returned stop is called.
func (c *Client) passResizes(ctx context.Context, id string, f *os.File) (stop func()) {
	resize := func() {
		w, h, err := term.GetSize(int(f.Fd()))
		if err != nil {
			return
		}
		q := url.Values{"h": {strconv.Itoa(h)}, "w": {strconv.Itoa(w)}, "running": {"true"}}
		_ = c.do(ctx, http.MethodPost, q, nil, nil, "containers", id, "resize")
	}
	resize()
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-winch:
				resize()
			}
		}
	}()
	return func() { signal.Stop(winch); close(done) }
}
