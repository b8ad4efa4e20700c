// Package tbworld is the one testbed-backed integration world: an
// itest.Env on a testbed's podman service, with a cage network of its own,
// its config written and parsed, the seal's firewall options in the
// testbed's host namespace, and what a suite asks for by option (the seal
// applied, the cage network made, the testbed probe binary, a peer cage
// with discovery responders and routes into the cage subnets, a scripted
// model API on the internet host, a git worktree, the CLI in the host
// namespace). test/agents, pkg/turn's resolver tests and pkg/probe's
// testbed tests share it; it lives apart from internal/testbed, which the
// tests of pkg/firewall (imported here) use.
package tbworld

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
	"github.com/shrooms-cage/shrooms/internal/testbed"
	"github.com/shrooms-cage/shrooms/internal/testcfg"
	"github.com/shrooms-cage/shrooms/pkg/cagelink"
	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/podman"
)

// World is one test's testbed world.
type World struct {
	*itest.Env
	TB *testbed.Testbed
	// Cfg is the config at Env.Config, parsed.
	Cfg    *config.Config
	Client *podman.Client
	// FW places the seal in the testbed's host namespace (and, with
	// WithTestbedDNS, resolves allowed names at the testbed's DNS canary).
	FW firewall.Options
	// Net names the cage network, its bridge and its seal tables (the
	// Env's prefix).
	Net string
	// N numbers the turns a test ran, for its task names and nonces.
	N int
	// Probe is the testbed probe binary, tbprobe (WithProbe).
	Probe string
	// Peer holds the peer cage's addresses, v4 and v6 (WithPeer).
	Peer []string
	// API is the scripted model API on the internet host and APIURL its
	// address, http://203.0.113.10:PORT (WithModelAPI).
	API    *modelapi.Server
	APIURL string
	// Binary is the shrooms binary the CLI runs (WithCLI).
	Binary string
	// Worktree is a git repository with one commit (WithWorktree).
	Worktree string
}

// Option varies a World.
type Option func(*options)

type options struct {
	tb       []testbed.Option
	service  []string
	cli      bool
	env      []itest.Option
	bin      string
	cage     map[string]any
	network  map[string]any
	extra    func(*World) string
	dns      bool
	seal     bool
	cageNet  bool
	probe    bool
	peer     bool
	api      bool
	worktree bool
}

// WithTestbed builds the testbed with opts (an IPv4-only internet, podman
// flags).
func WithTestbed(opts ...testbed.Option) Option {
	return func(o *options) { o.tb = append(o.tb, opts...) }
}

// WithService starts the testbed's podman service with these global
// flags (a runtime's).
func WithService(args ...string) Option { return func(o *options) { o.service = args } }

// WithCLI runs the CLI (Env.CLI) as bin, or a fresh build when bin is "",
// inside the testbed's host namespace.
func WithCLI(bin string) Option { return func(o *options) { o.cli, o.bin = true, bin } }

// WithEnv adds options of the itest.Env (prepared cages left by design).
func WithEnv(opts ...itest.Option) Option {
	return func(o *options) { o.env = append(o.env, opts...) }
}

// WithCage adds keys to the config's [cage] table (internal/testcfg's
// base; a nil value drops a base key).
func WithCage(keys map[string]any) Option {
	return func(o *options) { o.cage = merged(o.cage, keys) }
}

// WithNetwork adds keys to the config's [network] table (policy
// "internet", the world's name, bridge, subnets and the testbed's DNS as
// upstream unless given).
func WithNetwork(keys map[string]any) Option {
	return func(o *options) { o.network = merged(o.network, keys) }
}

// WithExtra appends the text extra returns to the config (more tables);
// it runs once the model API is up.
func WithExtra(extra func(*World) string) Option { return func(o *options) { o.extra = extra } }

// WithTestbedDNS makes the seal resolve names at the testbed's DNS canary
// (the allowlist's names).
func WithTestbedDNS() Option { return func(o *options) { o.dns = true } }

// WithSeal applies the seal before the test starts.
func WithSeal() Option { return func(o *options) { o.seal = true } }

// WithCageNetwork makes the cage network after the seal, as at boot.
func WithCageNetwork() Option { return func(o *options) { o.cageNet = true } }

// WithProbe builds the testbed probe binary (World.Probe).
func WithProbe() Option { return func(o *options) { o.probe = true } }

// WithPeer (with the seal, the network and the probe) runs a peer cage
// with a canary on the cage network, pins the bridge's MAC, starts the
// discovery responders on the bridge and routes the cage subnets from the
// LAN and the internet, so they could open connections into a cage.
func WithPeer() Option {
	return func(o *options) { o.peer, o.seal, o.cageNet, o.probe = true, true, true, true }
}

// WithModelAPI serves a scripted model API on the internet host, on a port
// of its own (the canaries hold the well-known ones).
func WithModelAPI() Option { return func(o *options) { o.api = true } }

// WithWorktree makes a git repository with one commit (a README).
func WithWorktree() Option { return func(o *options) { o.worktree = true } }

// New builds the world of one test named with prefix (two letters); its
// cleanup removes the tasks' cages, HOMEs and outboxes, then the cage
// network and the seal, then the testbed.
func New(t testing.TB, prefix string, opts ...Option) *World {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	w := &World{TB: testbed.New(t, o.tb...)}
	w.TB.StartPodmanWith(o.service...)
	envOpts := []itest.Option{itest.WithSocket(w.TB.PodmanURL)}
	if o.cli {
		w.Binary = o.bin
		if w.Binary == "" {
			w.Binary = itest.ShroomsBinary(t)
		}
		envOpts = append(envOpts, itest.WithBinary(w.Binary), itest.WithNetNS(w.TB.NSPath("host")))
	}
	// Made after the testbed, so that its cleanup runs before the testbed's.
	w.Env = itest.New(t, prefix, append(envOpts, o.env...)...)
	w.Net = w.Prefix
	w.FW = firewall.Options{NetNS: w.TB.NSPath("host")}
	if o.dns {
		w.FW.Resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return w.TB.DialContext("host")(ctx, network, net.JoinHostPort(testbed.InternetAddr4.String(), "53"))
		}}
	}
	if o.api {
		w.startAPI()
	}
	w.writeConfig(o)
	ctx := context.Background()
	client, err := podman.Connect(ctx, w.TB.PodmanURL)
	w.must(err, "podman")
	w.Client = client
	// A HOME's capped filesystem goes before its volume, in both mount
	// namespaces (ours and the testbed podman's).
	w.Release = testcfg.Release(w.Cfg, client)
	w.Finally(func() {
		_, _ = w.TB.Podman("network", "rm", "-f", w.Net)
		if n, err := cagelink.FromConfig(w.Cfg.Network, w.FW.NetNS); err == nil {
			_ = cagelink.Remove(n)
		}
		_ = firewall.Flush(context.Background(), w.Cfg.Network, w.FW)
	})
	if o.seal {
		w.must(firewall.Apply(ctx, w.Cfg.Network, w.FW), "seal")
	}
	if o.cageNet {
		_, err := w.EnsureCageNetwork(ctx, w.Cfg)
		w.must(err, "cage network")
	}
	if o.probe {
		w.Probe = w.TB.BuildProbe()
	}
	if o.peer {
		w.startPeer()
	}
	if o.worktree {
		w.makeWorktree()
	}
	return w
}

// writeConfig writes and parses the config: o's tables over the world's
// network.
func (w *World) writeConfig(o options) {
	w.T.Helper()
	sub4, sub6 := itest.Subnets(w.T)
	network := merged(map[string]any{"policy": "internet", "name": w.Net, "bridge": w.Net,
		// Subnets of its own (podman's network configs are the machine's).
		"subnet4":      sub4,
		"subnet6":      sub6,
		"dns_upstream": []string{testbed.InternetAddr4.String()}}, o.network)
	c := testcfg.Config{Cage: o.cage, Network: network}
	if o.extra != nil {
		c.Extra = o.extra(w)
	}
	w.WriteConfig(c.For(w.Env).TOML())
	cfg, err := config.Load(w.Config)
	w.must(err, "test config")
	w.Cfg = cfg
}

// startAPI serves the scripted model API on the internet host.
func (w *World) startAPI() {
	w.T.Helper()
	ln, err := w.TB.ListenTCP("internet", net.JoinHostPort(testbed.InternetAddr4.String(), "0"))
	w.must(err, "model API listener")
	w.API = modelapi.New()
	w.API.Serve(ln)
	w.T.Cleanup(func() { w.API.Close() })
	w.APIURL = "http://" + ln.Addr().String()
}

// EnsureCageNetwork makes the cage network as cfg's network.driver says
// (cagenet.Ensure, in the testbed's host namespace) and returns the
// shrooms driver's network (nil under driver podman) for a seal state.
func (w *World) EnsureCageNetwork(ctx context.Context, cfg *config.Config) (*cagelink.Net, error) {
	if err := cagenet.Ensure(ctx, cfg, w.Client, w.FW); err != nil {
		return nil, err
	}
	if cfg.Network.Driver != config.DriverShrooms {
		return nil, nil
	}
	n, err := cagelink.FromConfig(cfg.Network, w.FW.NetNS)
	return &n, err
}

// startPeer runs the peer cage and the discovery responders and routes
// the cage subnets into the testbed. The peer is on the cage network as
// the driver links cages: under driver shrooms a --network none
// container given its link before it starts.
func (w *World) startPeer() {
	w.T.Helper()
	peer := w.Net + "-peer"
	args := []string{"--name", peer, "--label", w.TB.Label(),
		"--cap-drop", "ALL", "--security-opt", "no-new-privileges", "-v", w.Probe + ":/tbprobe:ro",
		itest.TestImage, "timeout", "600", "/tbprobe", "listen"}
	if w.Cfg.Network.Driver == config.DriverPodman {
		w.TB.MustPodman(append([]string{"run", "-d", "--rm", "--network", w.Net}, args...)...)
		out := w.TB.MustPodman("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{.GlobalIPv6Address}}{{end}}", peer)
		w.Peer = strings.Fields(out)
	} else {
		w.TB.MustPodman(append([]string{"create", "--rm", "--network", "none"}, args...)...)
		w.TB.MustPodman("init", peer)
		pid, err := strconv.Atoi(strings.TrimSpace(w.TB.MustPodman("inspect", "-f", "{{.State.Pid}}", peer)))
		w.must(err, "peer cage pid")
		n, err := cagelink.FromConfig(w.Cfg.Network, w.FW.NetNS)
		w.must(err, "cage network")
		l, err := cagelink.Attach(context.Background(), n, cagenet.CageNetNS(pid))
		w.must(err, "peer cage link")
		w.TB.MustPodman("start", peer)
		w.Peer = []string{l.Addr4.String(), l.Addr6.String()}
	}
	if len(w.Peer) != 2 {
		w.T.Fatalf("peer cage addresses: %q", w.Peer)
	}
	// The bridge exists now. netavark 1.4 lets its MAC follow the lowest
	// port MAC (see pkg/firewall's pinBridgeMAC): pin it, so a cage
	// joining cannot cut the peer off from the gateway.
	b, err := w.TB.Exec("host", "ip", "-br", "link", "show", "dev", w.Net)
	w.must(err, "bridge: "+string(b))
	f := strings.Fields(string(b))
	if len(f) < 3 {
		w.T.Fatalf("bridge: %s", b)
	}
	b, err = w.TB.Exec("host", "ip", "link", "set", "dev", w.Net, "address", f[2])
	w.must(err, "pin the bridge MAC: "+string(b))
	w.must(w.TB.StartMulticast("host", w.Net), "discovery responders")
	sub4, err := netip.ParsePrefix(w.Cfg.Network.Subnet4)
	w.must(err, "subnet4")
	sub6, err := netip.ParsePrefix(w.Cfg.Network.Subnet6)
	w.must(err, "subnet6")
	w.TB.Route(sub4)
	w.TB.Route(sub6)
	w.must(w.TB.CheckIsolated(sub4, sub6), "testbed isolation")
}

// makeWorktree makes the git repository the cages run on.
func (w *World) makeWorktree() {
	w.T.Helper()
	w.Worktree = filepath.Join(w.Dir, "work")
	w.must(os.MkdirAll(w.Worktree, 0o755), "worktree")
	w.must(os.WriteFile(filepath.Join(w.Worktree, "README"), []byte("hello\n"), 0o644), "worktree")
	for _, args := range [][]string{{"init", "-q"}, {"add", "README"},
		{"-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "init"}} {
		out, err := exec.Command("git", append([]string{"-C", w.Worktree}, args...)...).CombinedOutput()
		w.must(err, fmt.Sprintf("git %v: %s", args, out))
	}
}

// must fails the test when err is set.
func (w *World) must(err error, what string) {
	w.T.Helper()
	if err != nil {
		w.T.Fatalf("%s: %v", what, err)
	}
}

// merged is a copy of base with over's keys over it.
func merged(base, over map[string]any) map[string]any {
	m := maps.Clone(base)
	if m == nil {
		m = map[string]any{}
	}
	maps.Copy(m, over)
	return m
}
