package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/podmanpeer"
	"github.com/shrooms-cage/shrooms/pkg/runsc"
)

// runscFix is the fix doctor names for a runsc without shrooms' profile.
const runscFix = "start the podman service with --runtime-flag oci-seccomp --runtime-flag platform=systrap --runtime-flag network=host (docs/gvisor.md)"

// doctorRunsc checks the flags the podman service gives runsc. Podman's
// API does not show them; the service's command line does when it is a
// process of this host (SO_PEERCRED of its socket), and the runsc binary
// says which flags it knows. Each turn also reads the flags from its own
// cage's sandbox and refuses the cage without --oci-seccomp, or when the
// sandbox is not a process of this host (docs/gvisor.md).
func doctorRunsc(ctx context.Context, cfg *config.Config, info *podman.HostInfo, add func(string, string, string, string)) {
	bin := info.OCIRuntimePath
	wrapper := script(bin)
	switch {
	case wrapper:
		add("runsc", "warn", bin+" is a script (a wrapper?): the flags it gives runsc are not visible here; each turn reads them from its cage's sandbox", "")
	default:
		if missing, err := runsc.Known(ctx, bin, "oci-seccomp", "platform", "network"); err != nil {
			add("runsc", "warn", fmt.Sprintf("cannot ask %s for its flags: %v", bin, err), "")
		} else if len(missing) > 0 {
			add("runsc", "fail", fmt.Sprintf("%s has no flag %s: shrooms' profile cannot be given to it", bin, strings.Join(missing, ", ")), "use the runsc `make setup` builds (docs/gvisor.md)")
			return
		} else {
			add("runsc", "ok", bin+" knows --oci-seccomp, --platform and --network", "")
		}
	}
	svc, err := podmanpeer.Identify(cfg.Podman.Socket)
	switch {
	case err != nil:
		add("runsc-flags", "warn", err.Error(), "")
		return
	case svc.Pid == 0:
		add("runsc-flags", "fail", svc.Why+": runsc's flags cannot be checked from here, and every gVisor turn would be refused (its sandbox is not a process of this host)", "run shrooms on the podman service's host")
		return
	case !svc.Identified:
		add("runsc-flags", "warn", svc.Why+": the runsc flags cannot be read here; each turn reads them from its cage's sandbox and refuses a cage without --oci-seccomp", "")
		return
	case wrapper && len(svc.RuntimeFlags) == 0:
		return
	}
	flags := runsc.FromRuntimeFlags(svc.RuntimeFlags)
	fail, warns := runsc.Judge(flags)
	given := fmt.Sprintf("the podman service (pid %d) gives runsc %s", svc.Pid, flagList(svc.RuntimeFlags))
	if fail != "" {
		add("runsc-flags", "fail", given+": "+fail+"; every gVisor turn would be refused", runscFix)
		return
	}
	for _, w := range warns {
		add("runsc-flags", "warn", given+": "+w, runscFix)
	}
	if len(warns) == 0 {
		add("runsc-flags", "ok", given, "")
	}
}

func flagList(fs []string) string {
	if len(fs) == 0 {
		return "no flags"
	}
	return "--" + strings.Join(fs, " --")
}

// script says whether path is a script (#!): a wrapper whose flags only
// its text knows.
func script(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, 2)
	n, _ := f.Read(b)
	return bytes.Equal(b[:n], []byte("#!"))
}
