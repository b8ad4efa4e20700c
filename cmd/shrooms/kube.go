package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/gateway"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/kube"
	"github.com/shrooms-cage/shrooms/pkg/profile"
	"github.com/shrooms-cage/shrooms/pkg/seccomp"
)

func kubeCommand() *cli.Command {
	return &cli.Command{
		Name:      "kube",
		Usage:     "print Kubernetes YAML for one task's sealed turn (agent-sandbox SandboxTemplate + Sandbox, or --plain Pod)",
		ArgsUsage: "[-- ARGS...]",
		Description: `Prints, changing nothing: a ConfigMap with the config, the task HOME's
PersistentVolumeClaim, a NetworkPolicy (no cluster, private, link-local or
metadata ranges; DNS only to the cluster resolver; egress per network.policy),
and the turn: an agent-sandbox SandboxTemplate and Sandbox, or with --plain a
Pod. The pod runs "shrooms kube reset-home" from --shrooms-image as an init
container on the HOME claim before the agent starts, with the cage's seal
(non-root cage.user, no capabilities, no privilege escalation, read-only
root, seccomp Localhost "shrooms/<profile>" — install it on every node with
"shrooms kube seccomp-profile", limits, memory emptyDirs, no service account
token, hostUsers: false); every container, the reset included, runs as
cage.user with no capabilities, as PodSecurity "restricted" requires (the
gateway as nobody). An agent with a gateway gets a gateway sidecar that alone
mounts the Secret shrooms-gateway-<name> (key "key").
See docs/kubernetes.md.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "task", Usage: "task `ID` (a-z 0-9 - . on a cluster)"},
			&cli.StringFlag{Name: "agent", Usage: "agent `NAME` from the config ([agents.NAME])"},
			&cli.IntFlag{Name: "turn", Value: 1, Usage: "turn `N` (names the pod or sandbox shrooms-<task>-<N>)"},
			&cli.StringFlag{Name: "worktree-pvc", Usage: "claim `NAME` mounted at /work (default: a memory emptyDir)"},
			&cli.BoolFlag{Name: "plain", Usage: "plain Pod + PVC + NetworkPolicy instead of agent-sandbox objects"},
			&cli.StringFlag{Name: "runtime-class", Usage: "pod runtimeClassName `NAME` (e.g. gvisor, kata)"},
			&cli.StringFlag{Name: "namespace", Usage: "`NAMESPACE` of every object (default: none, kubectl's)"},
			&cli.StringFlag{Name: "shrooms-image", Value: "localhost/shrooms:latest", Usage: "`IMAGE` with the static shrooms binary at " + kube.ShroomsPath + " (init container, gateway)"},
			&cli.StringFlag{Name: "storage-class", Usage: "storage class `NAME` of the HOME claim (default: the cluster's)"},
			&cli.StringSliceFlag{Name: "cluster-cidr", Usage: "pod or service `CIDR` to deny besides the private ranges (repeat)"},
		},
		Subcommands: []*cli.Command{kubeResetHomeCommand(), kubeGatewayCommand(), kubeSeccompCommand()},
		Action: func(c *cli.Context) error {
			if c.String("task") == "" || c.String("agent") == "" {
				return fail(ExitUsage, errors.New("kube: --task and --agent are required"))
			}
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			var text []byte
			if cfg.Source != "" {
				if text, err = os.ReadFile(cfg.Source); err != nil {
					return fail(ExitUsage, fmt.Errorf("kube: read config: %w", err))
				}
			}
			in := kube.Input{
				Task: c.String("task"), Agent: c.String("agent"), Turn: c.Int("turn"), Args: c.Args().Slice(),
				WorktreePVC: c.String("worktree-pvc"), RuntimeClass: c.String("runtime-class"),
				Namespace: c.String("namespace"), ShroomsImage: c.String("shrooms-image"),
				StorageClass: c.String("storage-class"), ClusterCIDRs: c.StringSlice("cluster-cidr"),
				ConfigTOML: text, Plain: c.Bool("plain"),
			}
			if a, err := cfg.Agent(in.Agent); err == nil && a.Gateway != "" {
				if in.Placeholder, err = gateway.NewPlaceholder(); err != nil {
					return fail(ExitInternal, err)
				}
			}
			objs, err := kube.Build(cfg, in)
			if err != nil {
				return fail(ExitUsage, err)
			}
			out, err := objs.YAML()
			if err != nil {
				return fail(ExitInternal, err)
			}
			_, err = c.App.Writer.Write(out)
			return err
		},
	}
}

func kubeResetHomeCommand() *cli.Command {
	return &cli.Command{
		Name:  "reset-home",
		Usage: "in a pod's init container: bootstrap (once) and reset the task HOME at --root, write the managed policy",
		Description: `Runs pkg/homereset on a directory, with no podman and no state directory: the
Kubernetes init container's half of a turn, run there as the agent's own
uid (--uid, --gid) with no capabilities. --root (home/ + .shrooms/) is
created, owned by the user running the reset, if missing. Credentials are not
seeded (on a cluster they reach the model through the gateway). Prints the
reset report as JSON.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "agent", Required: true, Usage: "agent `NAME` whose HOME profiles apply"},
			&cli.StringFlag{Name: "root", Required: true, Usage: "HOME volume `DIR` (home/ + .shrooms/)"},
			&cli.StringFlag{Name: "policy", Required: true, Usage: "`DIR` to write the managed policy into"},
			&cli.IntFlag{Name: "uid", Required: true, Usage: "agent `UID` owning HOME"},
			&cli.IntFlag{Name: "gid", Required: true, Usage: "agent `GID` owning HOME"},
			&cli.BoolFlag{Name: "gateway", Usage: "the agent's model requests go through the gateway (pinned in the policy)"},
			&cli.StringFlag{Name: "gateway-api", Value: "anthropic", Usage: "the gateway's API (anthropic or openai): which agent's provider the policy pins"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			agent, err := cfg.Agent(c.String("agent"))
			if err != nil {
				return fail(ExitUsage, err)
			}
			root := filepath.Clean(c.String("root"))
			if !filepath.IsAbs(root) {
				return fail(ExitUsage, fmt.Errorf("reset-home: --root %q must be absolute", root))
			}
			// Without privilege the reset can give files to no one but itself.
			if euid, egid := os.Geteuid(), os.Getegid(); euid != 0 && (c.Int("uid") != euid || c.Int("gid") != egid) {
				return fail(ExitUsage, fmt.Errorf("reset-home: running as uid %d gid %d without privilege, --uid/--gid must be those (got %d:%d)", euid, egid, c.Int("uid"), c.Int("gid")))
			}
			if err := unix.Mkdir(root, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
				return fail(ExitHostNotReady, fmt.Errorf("reset-home: create %s: %w", root, err))
			}
			// Seeding reads token files of the host; a cluster has none.
			for _, p := range profile.Names() {
				cfg.Home.Profile(p).Bootstrap = nil
			}
			t := home.Task{Root: root, UID: c.Int("uid"), GID: c.Int("gid"), Config: cfg, Profiles: agent.Home}
			rep, err := home.ResetDir(c.Context, t)
			if err != nil {
				return fail(ExitHostNotReady, fmt.Errorf("reset-home: %w", err))
			}
			var pg home.PolicyGateway
			if c.Bool("gateway") {
				switch c.String("gateway-api") {
				case "anthropic":
					pg.AnthropicBaseURL = gateway.BaseURL()
				case "openai":
					pg.OpenAIBaseURL = gateway.BaseURL()
				default:
					return fail(ExitUsage, fmt.Errorf("reset-home: --gateway-api %q is not anthropic or openai", c.String("gateway-api")))
				}
			}
			pol, err := home.PlanPolicy(c.String("policy"), cfg, agent.Home, pg)
			if err == nil {
				err = pol.Write()
			}
			if err != nil {
				return fail(ExitHostNotReady, fmt.Errorf("reset-home: managed policy: %w", err))
			}
			return printJSON(c.App.Writer, rep)
		},
	}
}

func kubeGatewayCommand() *cli.Command {
	return &cli.Command{
		Name:  "gateway",
		Usage: "in a pod's gateway sidecar: serve the model gateway on the pod's loopback",
		Description: `Accepts only the per-turn placeholder (from --placeholder-env) and forwards to
--upstream with the key from --key-file, which the agent container does not
mount. Serves until SIGTERM.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "api", Value: "anthropic", Usage: "provider `API`"},
			&cli.StringFlag{Name: "upstream", Required: true, Usage: "provider base `URL`"},
			&cli.StringFlag{Name: "key-file", Required: true, Usage: "`FILE` holding the real key"},
			&cli.StringFlag{Name: "placeholder-env", Required: true, Usage: "environment `VAR` holding the per-turn placeholder"},
			&cli.StringFlag{Name: "listen", Value: fmt.Sprintf("127.0.0.1:%d", gateway.Port), Usage: "`ADDR` to listen on"},
			&cli.StringSliceFlag{Name: "allow-beta", Usage: "forward anthropic-beta `VALUE` too (gateway.NAME.allow_betas)"},
			&cli.StringSliceFlag{Name: "allow-server-tool", Usage: "forward server-side `CAPABILITY` (gateway.NAME.allow_server_tools)"},
		},
		Action: func(c *cli.Context) error {
			u, err := url.Parse(c.String("upstream"))
			if err != nil {
				return fail(ExitUsage, fmt.Errorf("gateway: --upstream: %w", err))
			}
			key, err := os.ReadFile(c.String("key-file"))
			if err != nil {
				return fail(ExitUsage, fmt.Errorf("gateway: key: %w", err))
			}
			g, err := gateway.New(gateway.Config{API: c.String("api"), Upstream: u, Key: bytes.TrimSpace(key), Placeholder: os.Getenv(c.String("placeholder-env")),
				Policy: gateway.Policy{AllowBetas: c.StringSlice("allow-beta"), AllowServerTools: c.StringSlice("allow-server-tool")}})
			if err != nil {
				return fail(ExitUsage, err)
			}
			ln, err := net.Listen("tcp", c.String("listen"))
			if err != nil {
				return fail(ExitHostNotReady, fmt.Errorf("gateway: %w", err))
			}
			ctx, stop := signalContext(c.Context)
			defer stop()
			go g.Serve(ln)
			<-ctx.Done()
			return g.Close()
		},
	}
}

func kubeSeccompCommand() *cli.Command {
	return &cli.Command{
		Name:  "seccomp-profile",
		Usage: "print shrooms' seccomp profile; nodes keep it at /var/lib/kubelet/seccomp/<the path --json prints>",
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			if jsonMode(c) {
				return printJSON(c.App.Writer, map[string]string{"localhostProfile": kube.SeccompProfile(cfg)})
			}
			profile := seccomp.Profile()
			switch {
			case cfg.Cage.Seccomp == "podman":
				return fail(ExitUsage, errors.New("seccomp-profile: cage.seccomp is \"podman\": pods use the runtime's default profile"))
			case filepath.IsAbs(cfg.Cage.Seccomp):
				if profile, err = os.ReadFile(cfg.Cage.Seccomp); err != nil {
					return fail(ExitUsage, fmt.Errorf("seccomp-profile: %w", err))
				}
			}
			_, err = c.App.Writer.Write(profile)
			return err
		},
	}
}
