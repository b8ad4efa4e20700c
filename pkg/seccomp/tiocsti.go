package seccomp

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// LegacyTIOCSTIKnob is the sysctl (Linux 6.2+) that, at 0, makes the kernel
// refuse TIOCSTI to processes without CAP_SYS_ADMIN.
const LegacyTIOCSTIKnob = "/proc/sys/dev/tty/legacy_tiocsti"

// TIOCSTIClosed returns nil when a cage with a terminal cannot push input
// into it with TIOCSTI: shrooms' own profile (setting "shrooms") denies the
// call, or the kernel refuses it (knob, normally LegacyTIOCSTIKnob, reads
// 0). Otherwise the error is one line with the fix. Kernels without the
// knob (before 6.2) always allow TIOCSTI, so there only the profile closes
// it.
func TIOCSTIClosed(setting, knob string) error {
	if setting == "shrooms" {
		return nil
	}
	b, err := os.ReadFile(knob)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("--tty: this kernel has no dev.tty.legacy_tiocsti (before Linux 6.2 TIOCSTI is always allowed) and cage.seccomp = %q does not deny it: set cage.seccomp = \"shrooms\"", setting)
	case err != nil:
		return fmt.Errorf("--tty: cannot read %s: %w", knob, err)
	}
	switch v := strings.TrimSpace(string(b)); v {
	case "0":
		return nil
	default:
		return fmt.Errorf("--tty: TIOCSTI is open (dev.tty.legacy_tiocsti = %s) and cage.seccomp = %q does not deny it: run `sysctl -w dev.tty.legacy_tiocsti=0` (persist it in /etc/sysctl.d) or set cage.seccomp = \"shrooms\"", v, setting)
	}
}
