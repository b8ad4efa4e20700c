package cagenet

import (
	"fmt"

	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// resolvConf is every networked cage's resolv.conf under the shrooms
// driver: its own resolver on its loopback (pkg/dnsseal), nothing of the
// host's (no search domains, no resolvers of the LAN).
const resolvConf = "# shrooms: the cage's own resolver (docs/dns.md)\nnameserver 127.0.0.1\n"

// ResolvConfPath is where InstallResolvConf puts it under stateDir.
func ResolvConfPath(stateDir string) string { return taskstate.Layout{Dir: stateDir}.CageResolvConf() }

// InstallResolvConf writes the cages' resolv.conf to path unless it is
// there already.
func InstallResolvConf(path string) error {
	if err := taskstate.InstallFile(path, []byte(resolvConf)); err != nil {
		return fmt.Errorf("cage resolv.conf: %w", err)
	}
	return nil
}
