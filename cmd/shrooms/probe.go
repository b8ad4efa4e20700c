package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/probe"
	"github.com/shrooms-cage/shrooms/pkg/probedrive"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// probeCommand is `shrooms probe` (the battery, run in a cage) with its
// hidden `probe inside` subcommand, which is what the cage runs.
func probeCommand() *cli.Command {
	return &cli.Command{
		Name:  "probe",
		Usage: "run the breakout battery inside a cage and report every check",
		Description: `Runs shrooms itself (mounted read-only) in a fresh cage of the task, as the
agent user, and tries every way out: capabilities, seccomp, namespaces,
mounts, devices, sockets, secrets, and the network seal. One line per
check with its verdict: sealed, escaped, residual (a documented limitation)
or error. Exit status 1 when any check escaped or could not decide.
--targets names a JSON file of network targets (see docs/probe-schema.md);
without it they are discovered: the host's addresses, gateways, neighbours
and the first address of every network it routes to other than by its
default route, the clouds' metadata services, the host's and public
resolvers, example.com (or the allowlist) as the internet control, and a
peer cage the probe starts itself.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "task", Value: "probe", Usage: "task `ID` whose cage is probed"},
			&cli.StringFlag{Name: "agent", Value: "shell", Usage: "agent `NAME` whose image and settings are used"},
			&cli.StringFlag{Name: "targets", Usage: "network targets `FILE` (JSON: probe.Params)"},
			&cli.StringSliceFlag{Name: "resolvers", Usage: "without --targets: the resolver `ADDR`s D9b/D9c try, instead of the host's (resolv.conf) and well-known public ones"},
			&cli.DurationFlag{Name: "timeout", Usage: "deadline `DUR` of the probe turn", DefaultText: "2m"},
		},
		Subcommands: []*cli.Command{probeInsideCommand()},
		Action: func(c *cli.Context) error {
			var task taskid.ID
			r, ctx, stop, err := pipelineFor(c, func(cfg *config.Config) (err error) {
				if task, err = taskid.Parse(c.String("task")); err != nil {
					return err
				}
				_, err = cfg.Agent(c.String("agent"))
				return err
			})
			if err != nil {
				return err
			}
			defer stop()
			params, err := probeParams(c.String("targets"), r.Cfg, c.String("agent"), c.StringSlice("resolvers"))
			if err != nil {
				return fail(ExitUsage, err)
			}
			o := probedrive.Options{
				Task: task, Agent: c.String("agent"), Params: params,
				Timeout: c.Duration("timeout"), Stderr: c.App.ErrWriter,
			}
			if params.InboundPort != 0 {
				o.OnInbound = probedrive.DialInbound(params.Nonce)
			}
			// Without a targets file the probe brings its own peer cage (D8).
			o.Peer = c.String("targets") == ""
			rep, _, err := probedrive.Run(ctx, r, o)
			if err != nil {
				return fail(codeFor(err), err)
			}
			if jsonMode(c) {
				if err := printJSON(c.App.Writer, rep); err != nil {
					return err
				}
			} else {
				f, isFile := c.App.Writer.(*os.File)
				if err := probe.WriteTable(c.App.Writer, rep, isFile && isTerminal(f)); err != nil {
					return err
				}
			}
			if rep.Walls != nil && !rep.Walls.Agree {
				return fail(1, fmt.Errorf("breakout battery: the in-cage wall and the host seal do not agree (%+v)", *rep.Walls))
			}
			if rep.Failed() {
				return fail(1, fmt.Errorf("breakout battery: %d escaped, %d error (%s)", rep.Summary.Escaped, rep.Summary.Error, strings.Join(append(rep.IDs(probe.Escaped), rep.IDs(probe.Error)...), " ")))
			}
			return nil
		},
	}
}

// probeInsideCommand is what the cage runs; hidden from help.
func probeInsideCommand() *cli.Command {
	return &cli.Command{
		Name:   probe.InsideArgs[1],
		Hidden: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: strings.TrimPrefix(probe.ParamsFlag, "--")},
			&cli.BoolFlag{Name: strings.TrimPrefix(probe.NestedChildArg, "--")},
			&cli.BoolFlag{Name: strings.TrimPrefix(probe.PeerArg, "--")},
		},
		Action: func(c *cli.Context) error {
			if c.Bool(strings.TrimPrefix(probe.PeerArg, "--")) {
				probe.Peer(c.Context, c.App.ErrWriter)
				return nil
			}
			if c.Bool(strings.TrimPrefix(probe.NestedChildArg, "--")) {
				if code := probe.NestedChild(); code != 0 {
					return fail(code, nil)
				}
				return nil
			}
			var p probe.Params
			if s := c.String(strings.TrimPrefix(probe.ParamsFlag, "--")); s != "" {
				if err := json.Unmarshal([]byte(s), &p); err != nil {
					return fail(ExitUsage, fmt.Errorf("probe params: %w", err))
				}
			}
			rep := probe.Inside(context.Background(), p)
			b, err := json.Marshal(rep)
			if err != nil {
				return fail(ExitInternal, err)
			}
			fmt.Fprintln(c.App.Writer, string(b))
			return nil
		},
	}
}

// probeParams reads --targets (if any) and fills in what the host side
// knows from the config: policy, seccomp strictness, injected secrets and
// the gateway.
func probeParams(path string, cfg *config.Config, agent string, resolvers []string) (probe.Params, error) {
	var p probe.Params
	if path != "" {
		b, err := os.ReadFile(filepath.Clean(path))
		if err != nil {
			return p, fmt.Errorf("--targets: %w", err)
		}
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return p, fmt.Errorf("--targets %s: %w", path, err)
		}
	}
	if path == "" && cfg.Network.Networked() {
		// No targets file: aim at what the host tells about its network,
		// send discovery multicast, and connect into the cage (D15).
		if err := probedrive.Discover(&p, cfg.Network, firewall.Options{}); err != nil {
			return p, fmt.Errorf("discover probe targets: %w", err)
		}
		p.Multicast, p.InboundPort, p.InboundWaitMs = true, 18080, 3000
		if len(resolvers) > 0 {
			for _, r := range resolvers {
				if _, err := netip.ParseAddr(r); err != nil {
					return p, fmt.Errorf("--resolvers: %q is not an address", r)
				}
			}
			p.Resolvers = resolvers
		}
		probedrive.InternetFor(&p, cfg.Network, hostResolvers())
	}
	p.Policy = cfg.Network.Policy
	p.StrictSeccomp = cfg.Cage.StrictSeccomp()
	if a, err := cfg.Agent(agent); err == nil {
		for env := range a.TokenEnv {
			p.SecretEnv = append(p.SecretEnv, env)
		}
	}
	if cfg.Network.Networked() && len(p.Gateway) == 0 {
		if gw, err := sealed.Gateway4(cfg.Network); err == nil {
			p.Gateway = []string{gw.String()}
		}
	}
	if p.Nonce == "" {
		p.Nonce = fmt.Sprintf("sp%d", os.Getpid())
	}
	return p, nil
}

// hostResolvers are the nameservers of the host's /etc/resolv.conf.
func hostResolvers() []string {
	b, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "nameserver" {
			out = append(out, f[1])
		}
	}
	return out
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
