// Package probe is shrooms' breakout battery: checks that run inside a cage,
// as the agent user, and try every way out the threat model names (rows
// A1–A7, B1–B11, C1–C4 and D1–D15, D9 split into D9a–D9f; the table is in
// checks*.go and `shrooms probe` prints it). Each check reports what it attempted, the
// errno or value it observed, a verdict and evidence.
//
// shrooms is a static binary, so `shrooms probe` runs itself in a cage: the
// host side (pkg/probedrive) bind-mounts its own executable read-only at
// BinaryPath and makes `shrooms probe inside` the cage's command; the inside
// (Inside) prints one Report as JSON on stdout; the host side parses it
// (Parse), joins network attempts with canary logs when it has them (Join)
// and prints it (WriteTable or JSON). This package is the battery and its
// report; it starts no cage.
//
// Techniques are non-destructive: zero-byte opens for write tests,
// bad-argument syscalls to tell "allowed" (EBADF, EFAULT, EINVAL) from
// "blocked" (EPERM, ENOSYS), touch-only payloads that are removed again,
// network sends only to the addresses the host side names in Params.
//
// # JSON schema (version 1, stable; see testdata/schema.golden)
//
//	Report  {schema: 1, checks: [Check...], summary: {sealed, escaped, residual, error: int}}
//	Check   {id: "A1", name, attempt, observed, errno?, verdict, evidence: [string], reason?}
//	verdict one of "sealed", "escaped", "residual", "error"
//	Params  {policy, strictSeccomp, secretEnv, internet, internetNames, gateway, host, lan,
//	         metadata, peers, resolvers, tcpPorts, udpPorts, dnsZone, nonce,
//	         multicast, inboundPort, inboundWaitMs}
//
// "escaped" means the cage let the probe do something the threat model
// forbids; "residual" a known, documented limitation (docs/residual-risks.md);
// "error" that the check could not decide (including a failed positive
// control). Fields are only ever added, never renamed or removed.
package probe

import (
	"encoding/json"
	"fmt"
	"sort"
)

// SchemaVersion is the version of the Report JSON.
const SchemaVersion = 1

// BinaryPath is where the host side (probedrive.Run) mounts shrooms inside
// the cage.
const BinaryPath = "/.shrooms/shrooms"

// InsideArgs are the arguments (after the binary) of the hidden subcommand
// that runs the battery in a cage: `shrooms probe inside`.
var InsideArgs = []string{"probe", "inside"}

// ParamsFlag is the `probe inside` flag that carries Params as JSON.
const ParamsFlag = "--params-json"

// Verdict is the outcome of one check.
type Verdict string

const (
	Sealed   Verdict = "sealed"
	Escaped  Verdict = "escaped"
	Residual Verdict = "residual"
	Error    Verdict = "error"
)

// Check is one row of the battery.
type Check struct {
	ID       string   `json:"id"`
	Name     string   `json:"name"`
	Attempt  string   `json:"attempt"`
	Observed string   `json:"observed"`
	Errno    string   `json:"errno,omitempty"`
	Verdict  Verdict  `json:"verdict"`
	Evidence []string `json:"evidence"`
	// Reason explains a residual or error verdict in one line.
	Reason string `json:"reason,omitempty"`
	// Nonces are the tags of network attempts, for Join (host side).
	Nonces []Attempt `json:"attempts,omitempty"`
}

// Attempt is one network send of a check.
type Attempt struct {
	Nonce   string `json:"nonce"`
	Target  string `json:"target"`  // proto:addr:port
	Reached bool   `json:"reached"` // the prober saw an answer
	Allowed bool   `json:"allowed"` // policy lets it through
	Canary  *bool  `json:"canary,omitempty"`
}

// Summary counts verdicts.
type Summary struct {
	Sealed   int `json:"sealed"`
	Escaped  int `json:"escaped"`
	Residual int `json:"residual"`
	Error    int `json:"error"`
}

// Report is the battery's result.
type Report struct {
	Schema  int     `json:"schema"`
	Checks  []Check `json:"checks"`
	Summary Summary `json:"summary"`
	// Walls is what the host verified before the probe's cage started
	// (networked policies; set by Run, not by the cage).
	Walls *Walls `json:"walls,omitempty"`
}

// Walls are the two network walls of the probe's cage: the host seal
// around the bridge and the in-cage wall in the cage's own namespace.
// They agree when the wall verified and was built from the rule set the
// host seal was checked against.
type Walls struct {
	HostSeal string `json:"hostSeal"` // digest of the verified host seal
	Rules    string `json:"rules"`    // digest of the seal check's rule set
	// CageWall is the in-cage wall as verified (nil: none installed).
	CageWall *WallStatus `json:"cageWall"`
	Agree    bool        `json:"agree"`
}

// WallStatus is the in-cage wall as the host verified it: the fields of
// pkg/firewall's WallStatus (the host side converts one into the other, so
// the compiler keeps them the same), here so that the battery imports
// nothing of shrooms.
type WallStatus struct {
	// Rules is the digest of the rule set the wall was built from.
	Rules string `json:"rules"`
	// Expected and Installed are digests of the wall's canonical rendering
	// as built from the rules and as read from the kernel ("" if missing).
	Expected  string `json:"expected"`
	Installed string `json:"installed"`
	OK        bool   `json:"ok"`
	Reason    string `json:"reason,omitempty"`
}

// Params is what the host side tells the inside: the policy the cage is
// meant to have and the network targets (all optional; without targets the
// network rows only inspect and send nothing).
type Params struct {
	Policy        string   `json:"policy"`        // none, internet, allowlist
	StrictSeccomp bool     `json:"strictSeccomp"` // a shrooms-style profile is configured
	SecretEnv     []string `json:"secretEnv"`     // env vars deliberately injected
	Internet      []string `json:"internet"`      // addresses the policy allows (D2)
	// InternetNames are resolved inside the cage, through what the cage
	// is given (its resolver or /etc/hosts), into Internet when that is
	// empty: a positive control without a targets file.
	InternetNames []string `json:"internetNames,omitempty"`
	Gateway       []string `json:"gateway"`   // cage network gateways (D3)
	Host          []string `json:"host"`      // other host addresses (D4)
	LAN           []string `json:"lan"`       // LAN and private-range addresses (D6)
	Metadata      []string `json:"metadata"`  // metadata services (D7)
	Peers         []string `json:"peers"`     // other cages (D8)
	Resolvers     []string `json:"resolvers"` // DNS servers other than the gateway (D9b/c)
	TCPPorts      []int    `json:"tcpPorts"`
	UDPPorts      []int    `json:"udpPorts"`
	DNSZone       string   `json:"dnsZone"`   // canary zone for D9e
	Nonce         string   `json:"nonce"`     // prefix of every attempt's tag
	Multicast     bool     `json:"multicast"` // send discovery multicast (D5, D13)
	InboundPort   int      `json:"inboundPort"`
	InboundWaitMs int      `json:"inboundWaitMs"`
	// HostKernel is the host's kernel release, as the outside sees it:
	// B10 judges whether the cage's kernel is the host's (runc) or one of
	// its own (gVisor's Sentry). Run fills it.
	HostKernel string `json:"hostKernel,omitempty"`
}

// Summarize recomputes r.Summary from its checks and sorts nothing: the
// order of checks is the battery's.
func (r *Report) Summarize() {
	r.Summary = Summary{}
	for _, c := range r.Checks {
		switch c.Verdict {
		case Sealed:
			r.Summary.Sealed++
		case Escaped:
			r.Summary.Escaped++
		case Residual:
			r.Summary.Residual++
		default:
			r.Summary.Error++
		}
	}
}

// Failed reports whether any check escaped or could not decide.
func (r *Report) Failed() bool { return r.Summary.Escaped > 0 || r.Summary.Error > 0 }

// Verdicts maps check ids to verdicts.
func (r *Report) Verdicts() map[string]Verdict {
	m := map[string]Verdict{}
	for _, c := range r.Checks {
		m[c.ID] = c.Verdict
	}
	return m
}

// IDs returns the check ids with verdict v, sorted.
func (r *Report) IDs(v Verdict) []string {
	var out []string
	for _, c := range r.Checks {
		if c.Verdict == v {
			out = append(out, c.ID)
		}
	}
	sort.Strings(out)
	return out
}

// Parse decodes a Report and refuses one of another schema or without checks.
func Parse(b []byte) (*Report, error) {
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("probe report: %w", err)
	}
	if r.Schema != SchemaVersion {
		return nil, fmt.Errorf("probe report: schema %d, want %d", r.Schema, SchemaVersion)
	}
	if len(r.Checks) == 0 {
		return nil, fmt.Errorf("probe report: no checks")
	}
	for _, c := range r.Checks {
		switch c.Verdict {
		case Sealed, Escaped, Residual, Error:
		default:
			return nil, fmt.Errorf("probe report: check %s has unknown verdict %q", c.ID, c.Verdict)
		}
	}
	r.Summarize()
	return &r, nil
}
