package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"
)

// cageExecCommand runs inside a prepared cage: it reads the argv that
// `run` handed over in a read-only file and replaces itself with it.
func cageExecCommand() *cli.Command {
	return &cli.Command{
		Name:      "cage-exec",
		Hidden:    true,
		ArgsUsage: "ARGV-FILE",
		Action: func(c *cli.Context) error {
			b, err := os.ReadFile(c.Args().First())
			if err != nil {
				return fail(127, fmt.Errorf("cage-exec: %v", err))
			}
			var argv []string
			if err := json.Unmarshal(b, &argv); err != nil || len(argv) == 0 || argv[0] == "" {
				return fail(127, fmt.Errorf("cage-exec: no command was handed over"))
			}
			bin := argv[0]
			if !strings.Contains(bin, "/") {
				if bin, err = exec.LookPath(bin); err != nil {
					return fail(127, fmt.Errorf("cage-exec: %s: command not found", argv[0]))
				}
			}
			err = syscall.Exec(bin, argv, os.Environ())
			return fail(126, fmt.Errorf("cage-exec: %s: %v", argv[0], err))
		},
	}
}
