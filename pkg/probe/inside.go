package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// check is one battery row as code.
type check struct {
	id, name, attempt string
	run               func(ctx context.Context, p Params, c *Check)
}

// Inside runs the whole battery in the current process (inside a cage) and
// returns its report. A check that panics is reported as an error, never
// dropped.
func Inside(ctx context.Context, p Params) *Report {
	r := &Report{Schema: SchemaVersion}
	if len(p.Internet) == 0 && len(p.InternetNames) > 0 {
		p.Internet = resolveNames(ctx, p.InternetNames)
	}
	for _, ch := range battery() {
		c := Check{ID: ch.id, Name: ch.name, Attempt: ch.attempt, Evidence: []string{}}
		func() {
			defer func() {
				if e := recover(); e != nil {
					c.Verdict, c.Reason = Error, fmt.Sprintf("check panicked: %v", e)
				}
			}()
			ch.run(ctx, p, &c)
		}()
		if c.Verdict == "" {
			c.Verdict, c.Reason = Error, "check reached no verdict"
		}
		r.Checks = append(r.Checks, c)
	}
	r.Summarize()
	return r
}

func battery() []check {
	var all []check
	all = append(all, processChecks()...)
	all = append(all, kernelChecks()...)
	all = append(all, hostChecks()...)
	all = append(all, networkChecks()...)
	return all
}

// Helpers shared by the checks.

func (c *Check) ev(format string, a ...any) {
	c.Evidence = append(c.Evidence, fmt.Sprintf(format, a...))
}

func (c *Check) escape(format string, a ...any) {
	c.Verdict = Escaped
	c.ev("ESCAPED: "+format, a...)
}

// settle sets the verdict unless a worse one was already recorded.
func (c *Check) settle(v Verdict, reason string) {
	if c.Verdict == Escaped || c.Verdict == Error {
		return
	}
	if c.Verdict == Residual && v == Sealed {
		return
	}
	c.Verdict = v
	if reason != "" {
		c.Reason = reason
	}
}

func errnoName(err error) string {
	if err == nil {
		return "0"
	}
	var en unix.Errno
	if errors.As(err, &en) {
		if n := unix.ErrnoName(en); n != "" {
			return n
		}
		return fmt.Sprintf("errno %d", int(en))
	}
	return err.Error()
}

// blocked reports whether a bad-argument call was refused by policy
// (seccomp or a missing capability) rather than rejected for its arguments.
func blocked(err error) bool {
	return errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EACCES)
}

// openWrite is the zero-byte write test: open for writing, write nothing.
func openWrite(path string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

func readSmall(path string, n int) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b := make([]byte, n)
	m, err := io.ReadFull(f, b)
	if m > 0 {
		return string(b[:m]), nil
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "", nil
	}
	return "", err
}

func statusField(status, name string) string {
	for _, l := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && k == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// mountInfo is one line of /proc/self/mountinfo.
type mountInfo struct {
	root, point, opts, optional, fstype, source, super string
}

func mountTable() ([]mountInfo, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []mountInfo
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 3 {
			continue
		}
		out = append(out, mountInfo{root: unescape(f[3]), point: unescape(f[4]), opts: f[5], optional: strings.Join(f[6:], " "), fstype: g[0], source: g[1], super: g[2]})
	}
	return out, nil
}

func unescape(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

func hasOpt(opts, o string) bool {
	for _, x := range strings.Split(opts, ",") {
		if x == o {
			return true
		}
	}
	return false
}

func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}

// resolveNames resolves names the way the cage's programs do (its
// resolv.conf and /etc/hosts), each within a few seconds.
func resolveNames(ctx context.Context, names []string) []string {
	var out []string
	for _, n := range names {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		as, err := net.DefaultResolver.LookupHost(rctx, n)
		cancel()
		if err == nil {
			out = append(out, as...)
		}
	}
	return out
}
