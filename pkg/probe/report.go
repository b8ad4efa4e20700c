package probe

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// Join marks every network attempt with what the canaries saw (hit reports
// whether a canary logged the nonce) and re-judges the checks: an attempt
// the policy forbids that a canary logged is an escape, whatever the
// prober itself saw.
func Join(r *Report, hit func(nonce string) bool) {
	for i := range r.Checks {
		c := &r.Checks[i]
		for j := range c.Nonces {
			a := &c.Nonces[j]
			h := hit(a.Nonce)
			a.Canary = &h
			if h && !a.Allowed && c.Verdict != Residual {
				c.escape("canary logged %s (%s)", a.Nonce, a.Target)
			}
		}
	}
	r.Summarize()
}

// WriteTable prints one line per check; color adds ANSI colours to the
// verdicts (for terminals).
func WriteTable(w io.Writer, r *Report, color bool) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "%-5s %-9s %-38s %s\n", "ID", "VERDICT", "CHECK", "OBSERVED")
	for _, c := range r.Checks {
		v := fmt.Sprintf("%-9s", c.Verdict)
		if color {
			v = colorOf(c.Verdict) + v + "\x1b[0m"
		}
		obs := c.Observed
		if c.Reason != "" {
			obs += " — " + c.Reason
		}
		fmt.Fprintf(bw, "%-5s %s %-38s %s\n", c.ID, v, trunc(c.Name, 38), trunc(oneLine(obs), 160))
		if c.Verdict == Escaped {
			for _, e := range c.Evidence {
				if strings.HasPrefix(e, "ESCAPED: ") {
					fmt.Fprintf(bw, "%-5s %-9s   %s\n", "", "", e)
				}
			}
		}
	}
	s := r.Summary
	fmt.Fprintf(bw, "%d checks: %d sealed, %d escaped, %d residual, %d error\n", len(r.Checks), s.Sealed, s.Escaped, s.Residual, s.Error)
	if w := r.Walls; w != nil {
		state := "in-cage wall missing"
		if w.CageWall != nil && w.CageWall.OK {
			state = "in-cage wall " + w.CageWall.Installed
		}
		agree := "agree"
		if !w.Agree {
			agree = "DO NOT AGREE"
		}
		fmt.Fprintf(bw, "walls: host seal %s, %s; rule set %s: %s\n", w.HostSeal, state, w.Rules, agree)
	}
	return bw.Flush()
}

func colorOf(v Verdict) string {
	switch v {
	case Sealed:
		return "\x1b[32m"
	case Residual:
		return "\x1b[33m"
	}
	return "\x1b[1;31m"
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
