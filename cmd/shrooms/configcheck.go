package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// configCommand holds `shrooms config check`: the strict loader run on a
// file and nothing else (no podman, no nftables, no token files), so CI and
// the NixOS module (at build time, in the sandbox) can refuse a bad config
// before it reaches a host.
func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "check a configuration file",
		Subcommands: []*cli.Command{{
			Name:      "check",
			Usage:     "validate FILE (default: --config, SHROOMS_CONFIG or " + defaultConfigPath + ") with shrooms' own loader and load the files it names as a turn would; contacts nothing",
			ArgsUsage: "[FILE]",
			Flags:     []cli.Flag{&cli.BoolFlag{Name: "syntax", Usage: "run the loader only, loading none of the files the config names (a Nix build's sandbox has none of them)"}},
			Action: func(c *cli.Context) error {
				if c.NArg() > 1 {
					return fail(ExitUsage, fmt.Errorf("config check takes at most one FILE, got %d arguments", c.NArg()))
				}
				path := c.Args().First()
				if path == "" {
					path = configPath(c)
				}
				if path == "" {
					if _, err := os.Stat(defaultConfigPath); err == nil {
						path = defaultConfigPath
					}
				}
				notes := []string{}
				cfg, err := config.Load(path)
				if err == nil && !c.Bool("syntax") {
					notes, err = checkConfig(cfg)
				}
				if jsonMode(c) {
					res := map[string]any{"ok": err == nil, "file": path, "notes": notes}
					if err != nil {
						res["error"] = oneLine(err.Error())
					}
					if perr := printJSON(c.App.Writer, res); perr != nil {
						return fail(ExitInternal, fmt.Errorf("config check: %w", perr))
					}
				}
				if err != nil {
					return fail(ExitUsage, err)
				}
				if !jsonMode(c) {
					for _, n := range notes {
						textln(c.App.Writer, "note: "+n)
					}
					textln(c.App.Writer, "ok")
				}
				return nil
			},
		}},
	}
}
