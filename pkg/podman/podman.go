// Package podman is shrooms' only door to podman: a small client of podman's
// libpod REST API, spoken over the service's unix socket, for the few calls
// a turn needs (images, volumes, secrets, networks, and a container's create
// → attach/start → wait → remove). The spec sent is podman's own specgen
// type. Nothing else in shrooms talks to podman.
package podman

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/containers/podman/v5/pkg/specgen"
)

// Client is a connection to one podman service. It speaks podman's libpod
// REST API over the unix socket itself: podman's own bindings would pull
// in a dependency tree whose init functions cost most of shrooms' start.
type Client struct {
	http *http.Client
	// path is the socket, dialled again for each attach stream.
	path string
	uri  string
	// first, for a Lazy client, is its connect, made on its first call.
	first *firstUse
	// exited is the last cage ExitCode saw exited (OOMKilled reads it
	// instead of asking again: an exited cage's state is final).
	exited *exitSeen
}

// exitSeen is an exited cage's id and whether the OOM killer ended it.
type exitSeen struct {
	mu  sync.Mutex
	id  string
	oom bool
}

func (e *exitSeen) set(id string, oom bool) {
	if e != nil {
		e.mu.Lock()
		e.id, e.oom = id, oom
		e.mu.Unlock()
	}
}

func (e *exitSeen) get(id string) (oom, ok bool) {
	if e == nil {
		return false, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.oom, e.id == id && id != ""
}

// firstUse is the connect a Lazy client makes once, and how it went.
type firstUse struct {
	once sync.Once
	err  error
}

// ErrUnreachable marks a podman service that does not answer.
var ErrUnreachable = errors.New("podman API unreachable")

// Connect opens a connection to the podman service at uri (unix:///path) and
// checks that it answers within the context's deadline (10 s by default).
func Connect(ctx context.Context, uri string) (*Client, error) {
	c, err := newClient(uri)
	if err != nil {
		return nil, err
	}
	if err := c.ping(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Lazy is a client of the podman service at uri that connects (Connect's
// check that it answers) on its first call, not before: a command that
// may not need podman works while it is down, and one that needs it gets
// Connect's error from that call (and every later one).
func Lazy(uri string) *Client {
	c, err := newClient(uri)
	if err != nil {
		c = &Client{uri: uri} // a bad uri fails its first call
	}
	c.first = &firstUse{}
	if err != nil {
		c.first.once.Do(func() { c.first.err = err })
	}
	return c
}

func newClient(uri string) (*Client, error) {
	path, err := socketPath(uri)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnreachable, err)
	}
	return &Client{http: &http.Client{Transport: unixTransport(path)}, path: path, uri: uri, exited: &exitSeen{}}, nil
}

// ping checks the service answers within ctx's deadline (10 s by default).
func (c *Client) ping(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	if err := c.send(ctx, http.MethodGet, nil, nil, nil, "_ping"); err != nil {
		return fmt.Errorf("%w at %s: %v", ErrUnreachable, c.uri, oneLine(err))
	}
	return nil
}

// connected makes a Lazy client's connect on its first call.
func (c *Client) connected(ctx context.Context) error {
	if c.first == nil {
		return nil
	}
	c.first.once.Do(func() { c.first.err = c.ping(ctx) })
	return c.first.err
}

// Version returns the service's podman version and its API version.
func (c *Client) Version(ctx context.Context) (server, api string, err error) {
	var v struct {
		Version    string `json:"Version"`
		APIVersion string `json:"ApiVersion"`
	}
	if err := c.do(ctx, http.MethodGet, nil, nil, &v, "version"); err != nil {
		return "", "", fmt.Errorf("podman version: %w", err)
	}
	if v.Version == "" {
		return "", "", errors.New("podman version: the service reported no server version")
	}
	return v.Version, v.APIVersion, nil
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
	var info struct {
		Host struct {
			CgroupVersion string `json:"cgroupVersion"`
			CgroupManager string `json:"cgroupManager"`
			Security      struct {
				Rootless bool `json:"rootless"`
			} `json:"security"`
			OCIRuntime *struct {
				Name    string `json:"name"`
				Path    string `json:"path"`
				Version string `json:"version"`
			} `json:"ociRuntime"`
		} `json:"host"`
		Store struct {
			GraphRoot string `json:"graphRoot"`
		} `json:"store"`
	}
	if err := c.do(ctx, http.MethodGet, nil, nil, &info, "info"); err != nil {
		return nil, fmt.Errorf("podman info: %w", err)
	}
	h := &HostInfo{
		CgroupVersion: info.Host.CgroupVersion,
		CgroupManager: info.Host.CgroupManager,
		Rootless:      info.Host.Security.Rootless,
		GraphRoot:     info.Store.GraphRoot,
	}
	if r := info.Host.OCIRuntime; r != nil {
		h.OCIRuntime = r.Name
		h.OCIRuntimePath = r.Path
		h.OCIRuntimeVersion, _, _ = strings.Cut(r.Version, "\n")
	}
	return h, nil
}

// ImageExists reports whether ref is in the local store. Nothing is pulled.
func (c *Client) ImageExists(ctx context.Context, ref string) (bool, error) {
	ok, err := c.exists(ctx, "images", ref, "exists")
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
	var r struct {
		ID     string `json:"Id"`
		Digest string `json:"Digest"`
	}
	if err := c.do(ctx, http.MethodGet, nil, nil, &r, "images", ref, "json"); err != nil {
		return Image{}, fmt.Errorf("image %s: %s", ref, oneLine(err))
	}
	return Image{Name: ref, ID: r.ID, Digest: r.Digest}, nil
}

// VolumeExists reports whether the named volume exists.
func (c *Client) VolumeExists(ctx context.Context, name string) (bool, error) {
	ok, err := c.exists(ctx, "volumes", name, "exists")
	if err != nil {
		return false, fmt.Errorf("volume %s: %w", name, err)
	}
	return ok, nil
}

// CreateVolume creates a named local volume with labels. It fails if the
// volume exists.
func (c *Client) CreateVolume(ctx context.Context, name string, labels map[string]string) (mountpoint string, err error) {
	// The libpod API's field names (its VolumeCreateOptions has no JSON tags).
	body, err := jsonBody(struct {
		Name   string
		Driver string
		Label  map[string]string
	}{name, "local", labels})
	if err != nil {
		return "", fmt.Errorf("create volume %s: %w", name, err)
	}
	var r struct {
		Mountpoint string `json:"Mountpoint"`
	}
	if err := c.do(ctx, http.MethodPost, nil, body, &r, "volumes", "create"); err != nil {
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
	var r Volume
	if err := c.do(ctx, http.MethodGet, nil, nil, &r, "volumes", name, "json"); err != nil {
		return nil, fmt.Errorf("inspect volume %s: %w", name, err)
	}
	return &r, nil
}

// RemoveVolume removes a volume (force: also if a container uses it).
func (c *Client) RemoveVolume(ctx context.Context, name string) error {
	if err := c.do(ctx, http.MethodDelete, url.Values{"force": {"true"}}, nil, nil, "volumes", name); err != nil {
		return fmt.Errorf("remove volume %s: %w", name, err)
	}
	return nil
}

// PutSecret stores data as the named podman secret, replacing an older one.
// Secrets carry tokens into a cage's environment so that the spec names them
// and never holds their value.
func (c *Client) PutSecret(ctx context.Context, name string, data []byte, labels map[string]string) error {
	// Removed unconditionally: podman 4.3 has no secrets/NAME/exists
	// endpoint, and a secret a killed turn left behind would make every
	// later create fail.
	if err := c.do(ctx, http.MethodDelete, nil, nil, nil, "secrets", name); err != nil && !isNotFound(err) {
		return fmt.Errorf("replace secret %s: %w", name, err)
	}
	q := url.Values{"name": {name}}
	if len(labels) > 0 {
		q.Set("labels", jsonString(labels))
	}
	if err := c.do(ctx, http.MethodPost, q, strings.NewReader(string(data)), nil, "secrets", "create"); err != nil {
		// The error may quote the request, never the data: only name it.
		return fmt.Errorf("create secret %s failed", name)
	}
	return nil
}

// RemoveSecret deletes a secret; a missing one is not an error.
func (c *Client) RemoveSecret(ctx context.Context, name string) error {
	if err := c.do(ctx, http.MethodDelete, nil, nil, nil, "secrets", name); err != nil && !isNotFound(err) {
		return fmt.Errorf("remove secret %s: %w", name, err)
	}
	return nil
}

// Create creates (does not start) a container from a spec.
func (c *Client) Create(ctx context.Context, s *specgen.SpecGenerator) (string, error) {
	body, err := jsonBody(s)
	if err != nil {
		return "", fmt.Errorf("create cage: %w", err)
	}
	var r struct {
		ID string `json:"Id"`
	}
	if err := c.do(ctx, http.MethodPost, nil, body, &r, "containers", "create"); err != nil {
		return "", fmt.Errorf("create cage: %s", oneLine(err))
	}
	return r.ID, nil
}

// Wait blocks until the container exits and returns its exit code.
func (c *Client) Wait(ctx context.Context, id string) (int32, error) {
	// podman polls the state at this interval (250 ms by default, which
	// would be most of a short turn's overhead).
	q := url.Values{"condition": {"exited", "stopped"}, "interval": {"10ms"}}
	var code int32
	if err := c.do(ctx, http.MethodPost, q, nil, &code, "containers", id, "wait"); err != nil {
		if ctx.Err() != nil {
			return -1, ctx.Err()
		}
		return -1, fmt.Errorf("wait for cage: %s", oneLine(err))
	}
	return code, nil
}

// Stop sends the stop signal, then SIGKILL after grace.
func (c *Client) Stop(ctx context.Context, id string, grace time.Duration) error {
	secs := uint(grace.Round(time.Second) / time.Second)
	q := url.Values{"timeout": {fmt.Sprint(secs)}, "ignore": {"true"}}
	if err := c.do(ctx, http.MethodPost, q, nil, nil, "containers", id, "stop"); err != nil && !isNotFound(err) {
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
	q := url.Values{"force": {"true"}, "volumes": {"true"}, "ignore": {"true"}, "timeout": {"0"}}
	var reports []struct {
		ID  string          `json:"Id"`
		Err json.RawMessage `json:"Err"`
	}
	err := c.do(ctx, http.MethodDelete, q, nil, &reports, "containers", id)
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("remove cage %s: %s", short(id), oneLine(err))
	}
	for _, r := range reports {
		if msg := reportErr(r.Err); msg != "" && !isNotFound(errors.New(msg)) {
			return fmt.Errorf("remove cage %s: %s", short(id), oneLine(errors.New(msg)))
		}
	}
	return nil
}

// reportErr is the text of a removal report's error: podman encodes a Go
// error value, a string or an object, or leaves it out.
func reportErr(raw json.RawMessage) string {
	t := strings.TrimSpace(string(raw))
	if t == "" || t == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return t
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
	// Pid is the host pid of an initialised or running cage's process, 0
	// when it has none (CageNamed only).
	Pid int
}

// ListByLabel lists all containers (running or not) carrying label=value.
func (c *Client) ListByLabel(ctx context.Context, label, value string) ([]Cage, error) {
	filter := label
	if value != "" {
		filter += "=" + value
	}
	q := url.Values{"all": {"true"}, "filters": {jsonString(map[string][]string{"label": {filter}})}}
	list, err := c.listContainers(ctx, q)
	// Podman 4.3 fails a whole listing when any container (ours or not) is
	// between netns teardown and removal (podman#16140: "unknown FS magic on
	// /run/netns/…"). That window is milliseconds, and detached teardowns
	// make it common, so the listing is asked again for ~10 s (on a loaded
	// host one teardown was seen to outlast 5 s).
	for wait := 20 * time.Millisecond; err != nil && netnsTeardownRace(err) && wait < 6*time.Second; wait *= 2 {
		if sleep(ctx, wait) != nil {
			return nil, fmt.Errorf("list cages: %w", ctx.Err())
		}
		list, err = c.listContainers(ctx, q)
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

// listed is a container as podman's listing gives it.
type listed struct {
	ID     string            `json:"Id"`
	Names  []string          `json:"Names"`
	State  string            `json:"State"`
	Labels map[string]string `json:"Labels"`
}

func (c *Client) listContainers(ctx context.Context, q url.Values) ([]listed, error) {
	var list []listed
	err := c.do(ctx, http.MethodGet, q, nil, &list, "containers", "json")
	return list, err
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
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.Response == http.StatusNotFound
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
	if err := c.do(ctx, http.MethodPost, nil, nil, nil, "containers", id, "init"); err != nil {
		return fmt.Errorf("init cage: %s", oneLine(err))
	}
	return nil
}

// inspected is what shrooms reads of podman's container inspection.
type inspected struct {
	ID         string `json:"Id"`
	Name       string `json:"Name"`
	Image      string `json:"Image"`
	OCIRuntime string `json:"OCIRuntime"`
	State      *struct {
		Status    string `json:"Status"`
		Pid       int    `json:"Pid"`
		ExitCode  int32  `json:"ExitCode"`
		OOMKilled bool   `json:"OOMKilled"`
	} `json:"State"`
	Config *struct {
		Labels map[string]string `json:"Labels"`
		Tty    bool              `json:"Tty"`
	} `json:"Config"`
}

func (c *Client) inspect(ctx context.Context, id string) (*inspected, error) {
	var data inspected
	if err := c.do(ctx, http.MethodGet, url.Values{"size": {"false"}}, nil, &data, "containers", id, "json"); err != nil {
		return nil, err
	}
	return &data, nil
}

// Pid returns the host pid of an initialised or running container's
// process (its namespaces are reachable under /proc/PID/ns).
func (c *Client) Pid(ctx context.Context, id string) (int, error) {
	data, err := c.inspect(ctx, id)
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
	data, err := c.inspect(ctx, id)
	if err != nil {
		return -1, false, fmt.Errorf("inspect cage: %s", oneLine(err))
	}
	if data.State == nil {
		return -1, false, fmt.Errorf("inspect cage: no state")
	}
	switch data.State.Status {
	case "exited", "stopped":
		c.exited.set(data.ID, data.State.OOMKilled)
		return data.State.ExitCode, true, nil
	}
	return -1, false, nil
}

// VolumesByLabel lists the names of the volumes carrying label=value.
func (c *Client) VolumesByLabel(ctx context.Context, label, value string) ([]string, error) {
	q := url.Values{"filters": {jsonString(map[string][]string{"label": {label + "=" + value}})}}
	var vs []struct {
		Name string `json:"Name"`
	}
	if err := c.do(ctx, http.MethodGet, q, nil, &vs, "volumes", "json"); err != nil {
		return nil, fmt.Errorf("list volumes: %s", oneLine(err))
	}
	names := make([]string, 0, len(vs))
	for _, v := range vs {
		names = append(names, v.Name)
	}
	return names, nil
}
