// Package podmanpeer finds the podman service behind a unix API socket on
// this host and reads the OCI runtime it was started with: SO_PEERCRED of
// a connection names the process that listens (in this pid namespace), and
// its command line `podman [--runtime R] [--runtime-flag F]... system
// service` says the rest. Podman 4.x's containers.conf has no runtime
// flags, so the command line is where they are (or a wrapper's script,
// which this cannot read).
package podmanpeer

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Service is the podman service as this host sees it.
type Service struct {
	// Pid is the listening process (0: none in this pid namespace).
	Pid int
	// Identified is true when Pid runs `podman ... system service`.
	Identified bool
	// Why says, when not identified, what listens instead.
	Why string
	// Runtime is its --runtime ("" : containers.conf's engine.runtime).
	Runtime string
	// RuntimeFlags are its --runtime-flag values, in order.
	RuntimeFlags []string
}

// Identify connects to the unix socket of url (unix:///path) and reads
// what listens there. An error means the socket cannot be reached; a
// service that is not a process of this host comes back not identified.
func Identify(url string) (Service, error) {
	path, ok := strings.CutPrefix(url, "unix://")
	if !ok {
		return Service{Why: url + " is not a unix socket"}, nil
	}
	pid, err := Pid(url)
	if err != nil {
		return Service{}, err
	}
	s := Service{Pid: pid}
	if s.Pid == 0 {
		s.Why = path + " is served from outside this pid namespace"
		return s, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", s.Pid))
	if err != nil {
		s.Why = fmt.Sprintf("%s is served by pid %d, whose command line cannot be read: %v", path, s.Pid, err)
		return s, nil
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if !parse(args, &s) {
		s.Why = fmt.Sprintf("%s is served by pid %d (%.60q), not `podman system service` (socket activation, a proxy or a forward)", path, s.Pid, strings.Join(args, " "))
	}
	return s, nil
}

// parse reads podman's global flags up to `system service`; false when
// args are not a podman service's.
func parse(args []string, s *Service) bool {
	if len(args) == 0 || !strings.Contains(filepath.Base(args[0]), "podman") {
		return false
	}
	for i := 1; i < len(args); i++ {
		a := args[i]
		name, val, inline := strings.Cut(a, "=")
		switch name {
		case "--runtime", "--runtime-flag":
			if !inline {
				if i+1 >= len(args) {
					return false
				}
				i++
				val = args[i]
			}
			if name == "--runtime" {
				s.Runtime = val
			} else {
				s.RuntimeFlags = append(s.RuntimeFlags, val)
			}
		case "system":
			s.Identified = i+1 < len(args) && args[i+1] == "service"
			return s.Identified
		}
	}
	return false
}
