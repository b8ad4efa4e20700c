// Package podman is shrooms' only door to podman: a thin client over podman's
// REST bindings for the few calls a turn needs (images, volumes, secrets,
// networks, and a container's create → attach/start → wait → remove).
// Nothing else in shrooms talks to podman.
package podman

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containers/podman/v5/libpod/define"
	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/bindings/containers"
	"github.com/containers/podman/v5/pkg/bindings/images"
	"github.com/containers/podman/v5/pkg/bindings/secrets"
	"github.com/containers/podman/v5/pkg/bindings/system"
	"github.com/containers/podman/v5/pkg/bindings/volumes"
	"github.com/containers/podman/v5/pkg/domain/entities/types"
	"github.com/containers/podman/v5/pkg/errorhandling"
	"github.com/containers/podman/v5/pkg/specgen"
)

// Client is a connection to one podman service.
type Client struct {
	// conn is the bindings' connection context; every call derives from it.
	conn context.Context
	// uri is dialled again for each attach (Start).
	uri string
}

// ErrUnreachable marks a podman service that does not answer.
var ErrUnreachable = errors.New("podman API unreachable")

// Connect opens a connection to the podman service at uri (unix:///path) and
// checks that it answers within the context's deadline (10 s by default).
func Connect(ctx context.Context, uri string) (*Client, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	// The bindings keep the connection in the context they return, and they
	// ping the service while connecting.
	conn, err := bindings.NewConnection(context.WithoutCancel(ctx), uri)
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %v", ErrUnreachable, uri, oneLine(err))
	}
	return &Client{conn: conn, uri: uri}, nil
}

// scope returns a bindings context that is cancelled with ctx.
func (c *Client) scope(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancel(c.conn)
	if d, ok := ctx.Deadline(); ok {
		cctx, cancel = context.WithDeadline(c.conn, d)
	}
	stop := context.AfterFunc(ctx, cancel)
	return cctx, func() { stop(); cancel() }
}

// Version returns the service's podman version and its API version.
func (c *Client) Version(ctx context.Context) (server, api string, err error) {
	cctx, done := c.scope(ctx)
	defer done()
	v, err := system.Version(cctx, nil)
	if err != nil {
		return "", "", fmt.Errorf("podman version: %w", err)
	}
	if v.Server == nil {
		return "", "", errors.New("podman version: the service reported no server version")
	}
	return v.Server.Version, v.Server.APIVersion, nil
}

// HostInfo is what doctor needs from `podman info`.
type HostInfo struct {
	// OCIRuntime is the service's default runtime: its name, path and the
	// first line of its --version.
	OCIRuntime        string
	OCIRuntimePath    string
	OCIRuntimeVersion string
	CgroupVersion     string
	CgroupManager     string
	Rootless          bool
	GraphRoot         string
}

// Info returns facts about the podman host.
func (c *Client) Info(ctx context.Context) (*HostInfo, error) {
	cctx, done := c.scope(ctx)
	defer done()
	info, err := system.Info(cctx, nil)
	if err != nil {
		return nil, fmt.Errorf("podman info: %w", err)
	}
	h := &HostInfo{
		CgroupVersion: info.Host.CgroupsVersion,
		CgroupManager: info.Host.CgroupManager,
		Rootless:      info.Host.Security.Rootless,
		GraphRoot:     info.Store.GraphRoot,
	}
	if info.Host.OCIRuntime != nil {
		h.OCIRuntime = info.Host.OCIRuntime.Name
		h.OCIRuntimePath = info.Host.OCIRuntime.Path
		h.OCIRuntimeVersion, _, _ = strings.Cut(info.Host.OCIRuntime.Version, "\n")
	}
	return h, nil
}

// ImageExists reports whether ref is in the local store. Nothing is pulled.
func (c *Client) ImageExists(ctx context.Context, ref string) (bool, error) {
	cctx, done := c.scope(ctx)
	defer done()
	ok, err := images.Exists(cctx, ref, nil)
	if err != nil {
		return false, fmt.Errorf("image %s: %w", ref, err)
	}
	return ok, nil
}

// Image identifies an image in the local store.
type Image struct {
	// Name is the reference asked for.
	Name string `json:"name"`
	// ID is the image's id: the digest of its config (64 hex).
	ID string `json:"id"`
	// Digest is its manifest's digest ("sha256:…").
	Digest string `json:"digest"`
}

// InspectImage identifies ref in the local store. Nothing is pulled.
func (c *Client) InspectImage(ctx context.Context, ref string) (Image, error) {
	cctx, done := c.scope(ctx)
	defer done()
	r, err := images.GetImage(cctx, ref, nil)
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %s", ref, oneLine(err))
	}
	return Image{Name: ref, ID: r.ID, Digest: string(r.Digest)}, nil
}

// VolumeExists reports whether the named volume exists.
func (c *Client) VolumeExists(ctx context.Context, name string) (bool, error) {
	cctx, done := c.scope(ctx)
	defer done()
	ok, err := volumes.Exists(cctx, name, nil)
	if err != nil {
		return false, fmt.Errorf("volume %s: %w", name, err)
	}
	return ok, nil
}

// CreateVolume creates a named local volume with labels. It fails if the
// volume exists.
func (c *Client) CreateVolume(ctx context.Context, name string, labels map[string]string) (mountpoint string, err error) {
	cctx, done := c.scope(ctx)
	defer done()
	r, err := volumes.Create(cctx, types.VolumeCreateOptions{Name: name, Driver: "local", Label: labels}, nil)
	if err != nil {
		return "", fmt.Errorf("create volume %s: %w", name, err)
	}
	return r.Mountpoint, nil
}

// Volume is what shrooms needs of an existing volume.
type Volume struct {
	Name       string
	Mountpoint string
	Labels     map[string]string
}

// InspectVolume returns a volume's host mountpoint and labels.
func (c *Client) InspectVolume(ctx context.Context, name string) (*Volume, error) {
	cctx, done := c.scope(ctx)
	defer done()
	r, err := volumes.Inspect(cctx, name, nil)
	if err != nil {
		return nil, fmt.Errorf("inspect volume %s: %w", name, err)
	}
	return &Volume{Name: r.Name, Mountpoint: r.Mountpoint, Labels: r.Labels}, nil
}

// RemoveVolume removes a volume (force: also if a container uses it).
func (c *Client) RemoveVolume(ctx context.Context, name string) error {
	cctx, done := c.scope(ctx)
	defer done()
	if err := volumes.Remove(cctx, name, new(volumes.RemoveOptions).WithForce(true)); err != nil {
		return fmt.Errorf("remove volume %s: %w", name, err)
	}
	return nil
}

// PutSecret stores data as the named podman secret, replacing an older one.
// Secrets carry tokens into a cage's environment so that the spec names them
// and never holds their value.
func (c *Client) PutSecret(ctx context.Context, name string, data []byte, labels map[string]string) error {
	cctx, done := c.scope(ctx)
	defer done()
	// Removed unconditionally: podman 4.3 has no secrets/NAME/exists
	// endpoint (the bindings' Exists then says false), and a secret a
	// killed turn left behind would make every later create fail.
	if err := secrets.Remove(cctx, name); err != nil && !isNotFound(err) {
		return fmt.Errorf("replace secret %s: %w", name, err)
	}
	opts := new(secrets.CreateOptions).WithName(name).WithLabels(labels)
	if _, err := secrets.Create(cctx, strings.NewReader(string(data)), opts); err != nil {
		// The error may quote the request, never the data: only name it.
		return fmt.Errorf("create secret %s failed", name)
	}
	return nil
}

// RemoveSecret deletes a secret; a missing one is not an error.
func (c *Client) RemoveSecret(ctx context.Context, name string) error {
	cctx, done := c.scope(ctx)
	defer done()
	if err := secrets.Remove(cctx, name); err != nil && !isNotFound(err) {
		return fmt.Errorf("remove secret %s: %w", name, err)
	}
	return nil
}

// Create creates (does not start) a container from a spec.
func (c *Client) Create(ctx context.Context, s *specgen.SpecGenerator) (string, error) {
	cctx, done := c.scope(ctx)
	defer done()
	r, err := containers.CreateWithSpec(cctx, s, nil)
	if err != nil {
		return "", fmt.Errorf("create cage: %s", oneLine(err))
	}
	return r.ID, nil
}

// Streams are the process's standard streams wired to a cage. A nil Stdin
// means the cage's stdin is not attached.
type Streams struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Terminal: the cage has a terminal and Stdin and Stdout are the
	// person's (*os.File): they go to the bindings as they are, which put
	// the terminal in raw mode for the turn, pass on window size changes and
	// restore it afterwards. The cage's output then comes as one stream.
	Terminal bool
}

// Start attaches the streams to a created container, then starts it. It
// returns once the container runs; the returned channel yields the attach
// stream's end (nil when the output was fully copied).
func (c *Client) Start(ctx context.Context, id string, st Streams) (<-chan error, error) {
	// Attach replaces the transport of the connection it is given, so it
	// gets a connection of its own; the shared one stays usable.
	attachConn, release, err := c.streamConn(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %v", ErrUnreachable, c.uri, oneLine(err))
	}
	actx, cancel := context.WithCancel(attachConn)
	stopAttach := context.AfterFunc(ctx, cancel)
	ready := make(chan bool, 1)
	ended := make(chan error, 1)
	go func() {
		defer stopAttach()
		// The bindings reflect on the streams and panic on non-pointer
		// values (io.Discard), so each is passed behind a pointer.
		var in io.Reader
		var out, errOut io.Writer
		if st.Stdin != nil {
			in = &reader{st.Stdin}
		}
		if st.Stdout != nil {
			out = &writer{st.Stdout}
		}
		if f, ok := st.Stdin.(*os.File); ok && st.Terminal {
			in = f // the bindings look for an *os.File terminal
		}
		if f, ok := st.Stdout.(*os.File); ok && st.Terminal {
			out = f
		}
		if st.Stderr != nil {
			errOut = &writer{st.Stderr}
		}
		err := containers.Attach(actx, id, in, out, errOut, ready, new(containers.AttachOptions).WithStream(true))
		release()
		ended <- err
	}()
	select {
	case <-ready:
	case err := <-ended:
		cancel()
		return nil, fmt.Errorf("attach to cage: %s", oneLine(err))
	case <-ctx.Done():
		cancel()
		return nil, ctx.Err()
	}
	if err := c.start(ctx, id); err != nil {
		cancel()
		return nil, fmt.Errorf("start cage: %s", oneLine(err))
	}
	return ended, nil
}

// streamConn returns a bindings connection of its own for one attach
// stream, and release, which closes every socket it dialled. The bindings
// never close the stream's upgraded socket, nor the keep-alive connection of
// the inspect that precedes it: without release each turn would leave a
// socket and two goroutines behind in a long-lived process.
func (c *Client) streamConn(ctx context.Context) (context.Context, func(), error) {
	conn, err := bindings.NewConnection(context.WithoutCancel(ctx), c.uri)
	if err != nil {
		return nil, nil, err
	}
	bc, err := bindings.GetClient(conn)
	if err != nil {
		return nil, nil, err
	}
	tr, ok := bc.Client.Transport.(*http.Transport)
	if !ok {
		return nil, nil, fmt.Errorf("podman bindings: unexpected transport %T", bc.Client.Transport)
	}
	var mu sync.Mutex
	var dialled []net.Conn
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err == nil {
			mu.Lock()
			dialled = append(dialled, nc)
			mu.Unlock()
		}
		return nc, err
	}
	release := func() {
		tr.CloseIdleConnections()
		mu.Lock()
		defer mu.Unlock()
		for _, nc := range dialled {
			_ = nc.Close()
		}
		dialled = nil
	}
	return conn, release, nil
}

type reader struct{ r io.Reader }

func (r *reader) Read(p []byte) (int, error) { return r.r.Read(p) }

type writer struct{ w io.Writer }

func (w *writer) Write(p []byte) (int, error) { return w.w.Write(p) }

// Wait blocks until the container exits and returns its exit code.
func (c *Client) Wait(ctx context.Context, id string) (int32, error) {
	cctx, done := c.scope(ctx)
	defer done()
	// podman polls the state at this interval (250 ms by default, which
	// would be most of a short turn's overhead).
	opts := new(containers.WaitOptions).WithCondition([]define.ContainerStatus{define.ContainerStateExited, define.ContainerStateStopped}).WithInterval("10ms")
	code, err := containers.Wait(cctx, id, opts)
	if err != nil {
		if ctx.Err() != nil {
			return -1, ctx.Err()
		}
		return -1, fmt.Errorf("wait for cage: %s", oneLine(err))
	}
	return code, nil
}

// Stop sends the stop signal, then SIGKILL after grace.
func (c *Client) Stop(ctx context.Context, id string, grace time.Duration) error {
	cctx, done := c.scope(ctx)
	defer done()
	secs := uint(grace.Round(time.Second) / time.Second)
	err := containers.Stop(cctx, id, new(containers.StopOptions).WithTimeout(secs).WithIgnore(true))
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("stop cage %s: %s", short(id), oneLine(err))
	}
	return nil
}

// Remove force-removes a container (killing it if it runs) and its
// anonymous volumes. A container that is already gone is not an error.
// Podman's own exit cleanup can hold the cage's mounts for a moment after it
// exits ("device or resource busy"), so a failed removal is retried briefly.
func (c *Client) Remove(ctx context.Context, id string) error {
	// A service that is away (restarting) is waited for until ctx ends.
	var err error
	for attempt, delay := 0, reconnectFirst; attempt < 6; {
		if err = c.removeOnce(ctx, id); err == nil {
			return nil
		}
		wait := time.Duration(attempt+1) * 150 * time.Millisecond
		if IsConnectionError(err) {
			wait, delay = delay, min(2*delay, reconnectMax)
		} else {
			attempt++
		}
		if sleep(ctx, wait) != nil {
			return err
		}
	}
	return err
}

func (c *Client) removeOnce(ctx context.Context, id string) error {
	cctx, done := c.scope(ctx)
	defer done()
	opts := new(containers.RemoveOptions).WithForce(true).WithVolumes(true).WithIgnore(true).WithTimeout(0)
	reports, err := containers.Remove(cctx, id, opts)
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("remove cage %s: %s", short(id), oneLine(err))
	}
	for _, r := range reports {
		if r.Err != nil && !isNotFound(r.Err) {
			return fmt.Errorf("remove cage %s: %s", short(id), oneLine(r.Err))
		}
	}
	return nil
}

// Cage is a container shrooms created, as listed by its labels.
type Cage struct {
	ID     string
	Name   string
	State  string
	Labels map[string]string
	// Image is the id of the image the cage was created from (CageNamed
	// only; podman resolved its name then).
	Image string
	// Runtime is the OCI runtime podman runs the cage with: a name of its
	// containers.conf or, for a service started with --runtime PATH, that
	// path (CageNamed only).
	Runtime string
}

// ListByLabel lists all containers (running or not) carrying label=value.
func (c *Client) ListByLabel(ctx context.Context, label, value string) ([]Cage, error) {
	cctx, done := c.scope(ctx)
	defer done()
	filter := label
	if value != "" {
		filter += "=" + value
	}
	opts := new(containers.ListOptions).WithAll(true).WithFilters(map[string][]string{"label": {filter}})
	list, err := containers.List(cctx, opts)
	// Podman 4.3 fails a whole listing when any container (ours or not) is
	// between netns teardown and removal (podman#16140: "unknown FS magic on
	// /run/netns/…"). That window is milliseconds, and detached teardowns
	// make it common, so the listing is asked again for a few seconds.
	for wait := 20 * time.Millisecond; err != nil && netnsTeardownRace(err) && wait < 3*time.Second; wait *= 2 {
		select {
		case <-cctx.Done():
			return nil, fmt.Errorf("list cages: %w", cctx.Err())
		case <-time.After(wait):
		}
		list, err = containers.List(cctx, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("list cages: %s", oneLine(err))
	}
	out := make([]Cage, 0, len(list))
	for _, l := range list {
		name := ""
		if len(l.Names) > 0 {
			name = l.Names[0]
		}
		out = append(out, Cage{ID: l.ID, Name: name, State: l.State, Labels: l.Labels})
	}
	return out, nil
}

// netnsTeardownRace is podman#16140's error: podman itself reports it as
// text only.
func netnsTeardownRace(err error) bool {
	m := err.Error()
	return strings.Contains(m, "joining network namespace of container") && strings.Contains(m, "unknown FS magic")
}

func isNotFound(err error) bool {
	// "dial unix …: connect: no such file or directory" is a service that
	// is away, not a missing object.
	if IsConnectionError(err) {
		return false
	}
	var ee *errorhandling.ErrorModel
	if errors.As(err, &ee) {
		return ee.ResponseCode == http.StatusNotFound
	}
	return strings.Contains(err.Error(), "no such")
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// oneLine flattens an error message so that shrooms' errors stay one line.
func oneLine(err error) string {
	if err == nil {
		return ""
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// Init prepares a created container to start (the OCI runtime's create:
// namespaces, mounts, cgroups, network), so a later Start only runs it.
func (c *Client) Init(ctx context.Context, id string) error {
	cctx, done := c.scope(ctx)
	defer done()
	if err := containers.ContainerInit(cctx, id, nil); err != nil {
		return fmt.Errorf("init cage: %s", oneLine(err))
	}
	return nil
}

// Pid returns the host pid of an initialised or running container's
// process (its namespaces are reachable under /proc/PID/ns).
func (c *Client) Pid(ctx context.Context, id string) (int, error) {
	cctx, done := c.scope(ctx)
	defer done()
	data, err := containers.Inspect(cctx, id, new(containers.InspectOptions).WithSize(false))
	if err != nil {
		return 0, fmt.Errorf("inspect cage: %s", oneLine(err))
	}
	if data.State == nil || data.State.Pid <= 0 {
		return 0, fmt.Errorf("inspect cage: it has no process (state %v)", data.State)
	}
	return data.State.Pid, nil
}

// ExitCode returns the exit code of a container whose process has ended,
// or ok false while it still runs. Inspecting makes podman read the
// runtime's exit file at once, where Wait polls only every 250 ms.
func (c *Client) ExitCode(ctx context.Context, id string) (code int32, ok bool, err error) {
	cctx, done := c.scope(ctx)
	defer done()
	data, err := containers.Inspect(cctx, id, new(containers.InspectOptions).WithSize(false))
	if err != nil {
		return -1, false, fmt.Errorf("inspect cage: %s", oneLine(err))
	}
	if data.State == nil {
		return -1, false, fmt.Errorf("inspect cage: no state")
	}
	switch data.State.Status {
	case "exited", "stopped":
		return data.State.ExitCode, true, nil
	}
	return -1, false, nil
}

// VolumesByLabel lists the names of the volumes carrying label=value.
func (c *Client) VolumesByLabel(ctx context.Context, label, value string) ([]string, error) {
	cctx, done := c.scope(ctx)
	defer done()
	vs, err := volumes.List(cctx, new(volumes.ListOptions).WithFilters(map[string][]string{"label": {label + "=" + value}}))
	if err != nil {
		return nil, fmt.Errorf("list volumes: %s", oneLine(err))
	}
	names := make([]string, 0, len(vs))
	for _, v := range vs {
		names = append(names, v.Name)
	}
	return names, nil
}
