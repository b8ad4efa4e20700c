// Command shrooms runs each turn of an AI coding agent in a sealed podman
// cage. This file holds the CLI only: flags, output formats and exit codes.
// The work is done by the packages under pkg/.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// Exit codes of shrooms' own failures. Any other code is the agent's own.
const (
	ExitUsage        = 121 // bad config, flags, task id, paths or tokens
	ExitHostNotReady = 122 // podman, image, seal, state directory
	ExitBusy         = 123 // another turn of the task is running
	ExitDeadline     = 124 // the turn hit its deadline (cage stopped, removed)
	ExitInternal     = 125 // anything else shrooms could not do
	ExitLimit        = 120 // a per-turn model usage limit ended the turn (cage stopped, removed)
	ExitInterrupted  = 130 // SIGINT/SIGTERM (cage stopped, removed)
)

// defaultConfigPath is read when neither --config nor SHROOMS_CONFIG is set
// and the file exists.
const defaultConfigPath = "/etc/shrooms/config.toml"

func main() {
	os.Exit(run(os.Args, os.Stdin, os.Stdout, os.Stderr))
}

// exitError carries an exit code out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func fail(code int, err error) error { return &exitError{code: code, err: err} }

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	app := newApp(stdin, stdout, stderr)
	err := app.Run(args)
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil && ee.err.Error() != "" {
			fmt.Fprintln(stderr, "shrooms: "+oneLine(ee.err.Error()))
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "shrooms: "+oneLine(err.Error()))
	return ExitUsage
}

func newApp(stdin io.Reader, stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:  "shrooms",
		Usage: "run AI coding agents with permission prompts off, each turn in a sealed podman cage",
		Description: `Each turn runs in a fresh rootful podman container with no capabilities,
no-new-privileges, seccomp, a read-only root, a per-task user namespace and
resource limits. The task HOME persists, reset every turn; results leave only
through the worktree (/work) and the outbox.

Exit status: the agent's own exit code, or one of shrooms' own:
  121 bad input (config, flags, task id, paths, tokens)
  122 host not ready (podman, image, seal, state directory)
  123 task busy (another turn of the task is running)
  124 deadline (the cage was stopped and removed)
  125 internal error
  120 a per-turn model usage limit (gateway.*.max_*) ended the turn
  130 interrupted (the cage was stopped and removed)`,
		Version:         version,
		Reader:          stdin,
		Writer:          stdout,
		ErrWriter:       stderr,
		HideHelpCommand: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", EnvVars: []string{"SHROOMS_CONFIG"}, Usage: "config `FILE` (default " + defaultConfigPath + " if present, else built-in defaults)"},
			&cli.BoolFlag{Name: "json", Usage: "print machine-readable JSON on stdout"},
		},
		Commands: []*cli.Command{
			runCommand(),
			specCommand(),
			bootstrapCommand(),
			doctorCommand(),
			gcCommand(),
			netCommand(),
			outboxCommand(),
			probeCommand(),
			prepareCommand(),
			cageExecCommand(),
			commitCommand(),
			trustCommand(),
			resetCommand(),
			forgetCommand(),
			versionCommand(),
			configCommand(),
			completionCommand(),
		},
		ExitErrHandler: func(*cli.Context, error) {}, // run() maps errors to codes
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return fail(ExitUsage, err)
		},
	}
}

// loadConfig resolves and loads the configuration.
func loadConfig(c *cli.Context) (*config.Config, error) {
	path := c.String("config")
	if path == "" {
		if _, err := os.Stat(defaultConfigPath); err == nil {
			path = defaultConfigPath
		}
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, fail(ExitUsage, err)
	}
	return cfg, nil
}

// connect opens the podman connection the config names.
func connect(ctx context.Context, cfg *config.Config) (*podman.Client, error) {
	client, err := podman.Connect(ctx, cfg.Podman.Socket)
	if err != nil {
		return nil, fail(ExitHostNotReady, fmt.Errorf("%v (is the podman service running? try `shrooms doctor`)", err))
	}
	return client, nil
}

// sealChecker verifies the nftables seal in shrooms' own network namespace
// before a networked turn, then makes sure the cage network exists as
// configured (creating it if missing, unless dry). Under the allowlist
// policy it re-applies the seal first (refreshing the resolved names),
// unless dry.
func sealChecker(client *podman.Client) turn.SealChecker {
	return func(ctx context.Context, cfg *config.Config, dry bool) ([]string, error) {
		var hosts []string
		if cfg.Network.Policy == "allowlist" {
			var r firewall.Resolved
			var err error
			if dry {
				r, err = firewall.Resolve(ctx, cfg.Network, firewall.Options{})
			} else {
				r, err = firewall.ApplyResolved(ctx, cfg.Network, firewall.Options{})
			}
			if err != nil {
				return nil, err
			}
			hosts = r.HostEntries()
		}
		st, err := firewall.Verify(ctx, cfg.Network, firewall.Options{})
		if err != nil {
			return nil, err
		}
		if !st.OK {
			return nil, errors.New(st.Reason)
		}
		if dry {
			if n, err := client.InspectNetwork(ctx, cfg.Network.Name); err != nil || n == nil {
				return hosts, err // a missing network is created by the turn itself
			}
			return hosts, turn.CheckNetwork(ctx, cfg, client)
		}
		if _, err := turn.EnsureNetwork(ctx, cfg, client); err != nil {
			return nil, err
		}
		// Before this turn's cage joins the bridge, so that it cannot change
		// the gateway's address under the cages already running.
		if err := firewall.PinBridgeMAC(cfg.Network.Bridge, firewall.Options{}); err != nil {
			return nil, err
		}
		return hosts, nil
	}
}

// newRunner is the turn runner of the CLI: the seal checked in shrooms' own
// network namespace, and its own executable for prepared cages.
func newRunner(cfg *config.Config, client *podman.Client) *turn.Runner {
	r := turn.NewRunner(cfg, client, sealChecker(client))
	if exe, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			r.Binary = real
		}
	}
	return r
}

// signalContext is cancelled by SIGINT or SIGTERM.
func signalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}

// codeFor maps a turn error to shrooms' exit codes.
func codeFor(err error) int {
	switch {
	case errors.Is(err, turn.ErrInput):
		return ExitUsage
	case errors.Is(err, turn.ErrBusy):
		return ExitBusy
	case errors.Is(err, turn.ErrDeadline):
		return ExitDeadline
	case errors.Is(err, turn.ErrLimit):
		return ExitLimit
	case errors.Is(err, turn.ErrInterrupted):
		return ExitInterrupted
	case errors.Is(err, turn.ErrHostNotReady):
		return ExitHostNotReady
	case config.IsConfigError(err):
		return ExitUsage
	}
	return ExitInternal
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
