// Command shrooms runs each turn of an AI coding agent in a sealed podman
// cage. This file holds the CLI only: flags, output formats and exit codes.
// The work is done by the packages under pkg/.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
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
	ExitHistory      = 119 // a resumed session's history is not the one the gateway pinned (cage stopped, removed)
	ExitInterrupted  = 130 // SIGINT/SIGTERM/SIGHUP (cage stopped, removed)
)

// defaultConfigPath is read when neither --config nor SHROOMS_CONFIG is set
// and the file exists.
const defaultConfigPath = "/etc/shrooms/config.toml"

func main() {
	// The two processes of every turn are short-lived and allocate little:
	// no collection until the heap nears the limit (2-3 ms of CPU less per
	// process in BenchmarkHostCost), a collection as usual beyond it.
	if short := commandName(os.Args); short == "run" || short == "teardown-detached" {
		debug.SetGCPercent(-1)
		debug.SetMemoryLimit(128 << 20)
	}
	os.Exit(run(os.Args, os.Stdin, os.Stdout, os.Stderr))
}

// exitError carries an exit code out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }

func fail(code int, err error) error { return &exitError{code: code, err: err} }

func run(args []string, stdin io.Reader, out, stderr io.Writer) int {
	so := &stdout{w: out}
	app := newApp(stdin, so, stderr)
	err := app.Run(args)
	if err == nil {
		return 0
	}
	code, msg := ExitUsage, ""
	var ee *exitError
	if !errors.As(err, &ee) {
		msg = err.Error()
	} else {
		code, msg = ee.code, ""
		if ee.err != nil {
			msg = ee.err.Error()
		}
	}
	if msg != "" {
		warn(stderr, msg)
	}
	// Under --json the last line of stdout is a JSON object on every path,
	// also when flags, config or podman failed before the command printed
	// its own.
	if wantsJSON(args) && !so.printed {
		if msg == "" {
			msg = fmt.Sprintf("exit status %d", code)
		}
		_ = printJSON(so, errorObject{Command: commandName(args), Status: "error", ExitCode: code, Error: oneLine(msg)})
	}
	return code
}

func newApp(stdin io.Reader, stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:  "shrooms",
		Usage: "run AI coding agents with permission prompts off, each turn in a sealed podman cage",
		Description: `Each turn runs in a fresh rootful podman container with no capabilities,
no-new-privileges, seccomp, a read-only root, a per-task user namespace and
resource limits. The task HOME persists, reset every turn; results leave only
through the worktree (/work) and the outbox.

Global flags (--config, --json) go before or after the command.
With --json every command prints one JSON object as the last line of
stdout, on every path (see docs/json.md).

Exit status: the agent's own exit code, or one of shrooms' own:
  121 bad input (config, flags, task id, paths, tokens)
  122 host not ready (podman, image, seal, state directory)
  123 task busy (another turn of the task is running; for purge: a task,
      delivery or cage is left)
  124 deadline (the cage was stopped and removed)
  125 internal error
  120 a per-turn model usage limit (gateway.*.max_*) ended the turn
  119 a resumed session's history differs from the one the model gateway
      forwarded before (gateway.*.history = "refuse")
  130 interrupted: SIGINT, SIGTERM, SIGHUP or ` + "`shrooms stop`" + ` (the cage was stopped and removed)`,
		Version:   version,
		Reader:    stdin,
		Writer:    stdout,
		ErrWriter: stderr,
		// --help is added by hand: urfave adds it only without a "help" command.
		// --version is shrooms' own, so that it prints what `version` prints.
		HideVersion: true,
		Flags:       append(globalFlags(true), cli.HelpFlag, &cli.BoolFlag{Name: "version", Aliases: []string{"v"}, Usage: "print shrooms' version (as `shrooms version`)"}),
		// shrooms' own help command: urfave's shared one makes its fish
		// completion generator recurse forever.
		HideHelpCommand: true,
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
			teardownCommand(),
			commitCommand(),
			trustCommand(),
			resetCommand(),
			forgetCommand(),
			purgeCommand(),
			tasksCommand(),
			statusCommand(),
			logCommand(),
			stopCommand(),
			versionCommand(),
			helpCommand(),
			configCommand(),
			completionCommand(),
			completeTasksCommand(),
			manCommand(),
			kubeCommand(),
		},
		ExitErrHandler: func(*cli.Context, error) {}, // run() maps errors to codes
		OnUsageError:   usageError,
		Action: func(c *cli.Context) error {
			if c.Bool("version") {
				return printVersion(c)
			}
			return unknownCommand(c)
		},
	}
	globalize(app.Commands)
	return app
}

// globalFlags are accepted before and after the command.
func globalFlags(root bool) []cli.Flag {
	cfg := &cli.StringFlag{Name: "config", Usage: "config `FILE` (default " + defaultConfigPath + " if present, else built-in defaults)"}
	if root {
		cfg.EnvVars = []string{"SHROOMS_CONFIG"}
	}
	return []cli.Flag{cfg, &cli.BoolFlag{Name: "json", Usage: "print one JSON object as the last line of stdout (docs/json.md)"}}
}

// globalize gives every command the global flags, turns urfave's required
// flags into shrooms' own check (one line on stderr, exit 121, no help text
// on stdout) with "(required)" in the help, and routes usage errors there.
func globalize(cmds []*cli.Command) {
	for _, cmd := range cmds {
		if cmd.Hidden {
			continue
		}
		cmd.Flags = append(cmd.Flags, globalFlags(false)...)
		var required []string
		for _, f := range cmd.Flags {
			var req *bool
			var usage *string
			switch t := f.(type) {
			case *cli.StringFlag:
				req, usage = &t.Required, &t.Usage
			case *cli.IntFlag:
				req, usage = &t.Required, &t.Usage
			case *cli.StringSliceFlag:
				req, usage = &t.Required, &t.Usage
			case *cli.DurationFlag:
				req, usage = &t.Required, &t.Usage
			}
			if req != nil && *req {
				*req = false
				*usage += " (required)"
				required = append(required, f.Names()[0])
			}
		}
		if len(required) > 0 {
			before := cmd.Before
			cmd.Before = func(c *cli.Context) error {
				for _, name := range required {
					if !c.IsSet(name) {
						return fail(ExitUsage, fmt.Errorf("required flag --%s not set (see `shrooms%s --help`)", name, commandPath(c)))
					}
				}
				if before != nil {
					return before(c)
				}
				return nil
			}
		}
		cmd.OnUsageError = usageError
		if len(cmd.Subcommands) > 0 && cmd.Action == nil {
			cmd.Action = unknownCommand
		}
		globalize(cmd.Subcommands)
	}
}

// helpCommand is `shrooms help [COMMAND [SUBCOMMAND]]`.
func helpCommand() *cli.Command {
	return &cli.Command{
		Name:      "help",
		Usage:     "show the commands, or one command's flags (same as COMMAND --help)",
		ArgsUsage: "[COMMAND [SUBCOMMAND]]",
		Action: func(c *cli.Context) error {
			args := c.Args().Slice()
			if len(args) == 0 {
				return cli.ShowAppHelp(c)
			}
			cmd := c.App.Command(args[0])
			if cmd == nil {
				return fail(ExitUsage, fmt.Errorf("unknown command %q (see `shrooms help`)", args[0]))
			}
			if len(args) > 1 && (cmd.Command(args[1]) == nil || len(args) > 2) {
				return fail(ExitUsage, fmt.Errorf("unknown command %q (see `shrooms help %s`)", strings.Join(args[1:], " "), args[0]))
			}
			// Printed the way "COMMAND [SUBCOMMAND] --help" prints it.
			return c.App.Run(append(append([]string{c.App.Name}, args...), "--help"))
		},
	}
}

// unknownCommand is the action of the app and of commands with
// subcommands: help without arguments, a usage error with one.
func unknownCommand(c *cli.Context) error {
	if !c.Args().Present() {
		return cli.ShowSubcommandHelp(c)
	}
	return fail(ExitUsage, fmt.Errorf("unknown command %q (see `shrooms%s --help`)", c.Args().First(), commandPath(c)))
}

// commandPath is " outbox list" for the outbox list command, "" at the top.
func commandPath(c *cli.Context) string {
	var names []string
	for _, cc := range c.Lineage() {
		if cc.Command != nil && cc.Command.Name != "" && cc.Command.Name != c.App.Name {
			names = append([]string{cc.Command.Name}, names...)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return " " + strings.Join(names, " ")
}

func usageError(c *cli.Context, err error, _ bool) error {
	return fail(ExitUsage, fmt.Errorf("%s (see `shrooms%s --help`)", doubleDash(err.Error()), commandPath(c)))
}

// singleDash finds a flag name as Go's flag package writes it in errors
// ("flag provided but not defined: -foo", "invalid value … for flag -timeout").
var singleDash = regexp.MustCompile(`(defined: |argument: |for flag )-([A-Za-z][A-Za-z0-9-]+)`)

// doubleDash writes flag names in errors the way shrooms' help shows them.
func doubleDash(msg string) string { return singleDash.ReplaceAllString(msg, "$1--$2") }

// jsonMode reports whether --json was given, before or after the command.
func jsonMode(c *cli.Context) bool {
	for _, cc := range c.Lineage() {
		if cc.IsSet("json") {
			return cc.Bool("json")
		}
	}
	return false
}

// configPath is --config as given nearest to the command, else
// $SHROOMS_CONFIG, else "".
func configPath(c *cli.Context) string {
	for _, cc := range c.Lineage() {
		if cc.IsSet("config") {
			return cc.String("config")
		}
	}
	return ""
}

// wantsJSON finds --json in the raw arguments (before "--"), for errors
// that happen before the flags are parsed.
func wantsJSON(args []string) bool {
	want := false
	for _, a := range args[min(1, len(args)):] {
		if a == "--" {
			break
		}
		switch strings.TrimLeft(a, "-") {
		case "json", "json=true", "json=1":
			want = strings.HasPrefix(a, "-")
		case "json=false", "json=0":
			want = false
		}
	}
	return want
}

// commandName is the command the arguments name ("run", "net flush").
func commandName(args []string) string {
	var words []string
	for i := 1; i < len(args) && len(words) < 2; i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if strings.HasPrefix(a, "-") {
			if (a == "--config" || a == "-config") && i+1 < len(args) {
				i++
			}
			if len(words) > 0 {
				break
			}
			continue
		}
		words = append(words, a)
		if a != "net" && a != "outbox" && a != "probe" {
			break
		}
	}
	return strings.Join(words, " ")
}

// loadConfig resolves and loads the configuration.
func loadConfig(c *cli.Context) (*config.Config, error) {
	cfg, err := config.Load(resolvedConfigPath(c))
	if err != nil {
		return nil, fail(ExitUsage, err)
	}
	return cfg, nil
}

// resolvedConfigPath is the config file loadConfig reads, "" for the
// built-in defaults.
func resolvedConfigPath(c *cli.Context) string {
	path := configPath(c)
	if path == "" {
		if _, err := os.Stat(defaultConfigPath); err == nil {
			path = defaultConfigPath
		}
	}
	return path
}

// connect opens the podman connection the config names.
func connect(ctx context.Context, cfg *config.Config) (*podman.Client, error) {
	client, err := podman.Connect(ctx, cfg.Podman.Socket)
	if err != nil {
		return nil, fail(ExitHostNotReady, fmt.Errorf("%v (is the podman service running? try `shrooms doctor`)", err))
	}
	return client, nil
}

// newRunner is the turn runner of the CLI: the seal checked in shrooms' own
// network namespace, and its own executable for prepared cages.
func newRunner(cfg *config.Config, client *podman.Client) *turn.Runner {
	r := turn.NewRunner(cfg, client, cagenet.Checker(client))
	// While a networked cage runs, a lost seal is put back within a
	// quarter second, or the cage is stopped.
	r.WatchSeal = cagenet.Watcher(firewall.Options{})
	// Each networked cage gets its own resolver on its loopback, pinning
	// allowlist answers into the seal before it answers.
	r.Resolver = cagenet.Resolver(firewall.Options{}, nil)
	if exe, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			r.Binary = real
		}
	}
	return r
}

// signalContext is cancelled by SIGINT, SIGTERM or SIGHUP. A hang-up (the
// terminal of `run --tty` closed, an ssh connection dropped) ends the turn
// like SIGTERM does: the cage stopped and removed, the worktree given back,
// the result and the turn record written; it must never kill shrooms with
// the cage left running.
func signalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
}

// codeFor maps an error to shrooms' exit code by its kind (pkg/fault),
// never its text: the outermost kind, as errors now keep their causes (a
// host-not-ready error may wrap a bad-input cause; it stays host-not-ready).
func codeFor(err error) int {
	switch fault.Of(err) {
	case fault.Input:
		return ExitUsage
	case fault.Busy:
		return ExitBusy
	case fault.Deadline:
		return ExitDeadline
	case fault.Limit:
		return ExitLimit
	case fault.History:
		return ExitHistory
	case fault.Interrupted:
		return ExitInterrupted
	case fault.HostNotReady:
		return ExitHostNotReady
	}
	if config.IsConfigError(err) {
		return ExitUsage
	}
	return ExitInternal
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
