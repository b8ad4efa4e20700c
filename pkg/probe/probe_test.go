package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"
)

// sample has every field of the schema set.
func sample() *Report {
	yes := true
	r := &Report{Schema: SchemaVersion, Checks: []Check{
		{ID: "A1", Name: "capabilities", Attempt: "parse caps", Observed: "CapEff=0", Verdict: Sealed, Evidence: []string{"e"}},
		{ID: "D3", Name: "host via gateway", Attempt: "tcp", Observed: "1/1", Errno: "EPERM", Verdict: Escaped, Evidence: []string{"ESCAPED: x"},
			Nonces: []Attempt{{Nonce: "n-d3-1", Target: "tcp:10.0.0.1:80", Reached: true, Allowed: false, Canary: &yes}}},
		{ID: "B10", Name: "kernel info", Verdict: Residual, Evidence: []string{}, Reason: "shared kernel"},
		{ID: "D2", Name: "internet", Verdict: Error, Evidence: []string{}, Reason: "positive control failed"},
	}}
	r.Summarize()
	return r
}

// The report JSON is a stable interface: this golden file changes only when
// fields are added (and SchemaVersion when anything else changes).
func TestSchemaGolden(t *testing.T) {
	b, err := json.MarshalIndent(struct {
		Report *Report `json:"report"`
		Params Params  `json:"params"`
	}{sample(), Params{Policy: "internet", StrictSeccomp: true, SecretEnv: []string{"K"}, Internet: []string{"203.0.113.10"},
		InternetNames: []string{"example.com"}, Gateway: []string{"10.89.0.1"}, Host: []string{"192.168.1.2"}, LAN: []string{"192.168.1.1"}, Metadata: []string{"169.254.169.254"},
		Peers: []string{"10.89.0.3"}, Resolvers: []string{"203.0.113.10"}, TCPPorts: []int{80}, UDPPorts: []int{5000}, DNSZone: "canary.test",
		Nonce: "n", Multicast: true, InboundPort: 18080, InboundWaitMs: 3000}}, "", "  ")
	assert.NilError(t, err)
	golden.Assert(t, string(b)+"\n", "schema.golden")
}

func TestParse(t *testing.T) {
	good, _ := json.Marshal(sample())
	r, err := Parse(good)
	assert.NilError(t, err)
	assert.DeepEqual(t, r.Summary, Summary{Sealed: 1, Escaped: 1, Residual: 1, Error: 1})
	assert.Assert(t, r.Failed())
	for _, tc := range []struct{ name, in, msg string }{
		{"not json", "nope", "probe report"},
		{"other schema", `{"schema":2,"checks":[{"id":"A1","verdict":"sealed"}]}`, "schema 2"},
		{"no checks", `{"schema":1,"checks":[]}`, "no checks"},
		{"unknown verdict", `{"schema":1,"checks":[{"id":"A1","verdict":"fine"}]}`, "unknown verdict"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in))
			assert.ErrorContains(t, err, tc.msg)
		})
	}
}

func TestJoinTurnsCanaryHitsIntoEscapes(t *testing.T) {
	r := &Report{Schema: 1, Checks: []Check{
		{ID: "D6", Verdict: Sealed, Nonces: []Attempt{{Nonce: "a", Target: "tcp:192.168.1.1:80"}}},
		{ID: "D2", Verdict: Sealed, Nonces: []Attempt{{Nonce: "b", Target: "tcp:203.0.113.10:80", Reached: true, Allowed: true}}},
		{ID: "D9e", Verdict: Residual, Nonces: []Attempt{{Nonce: "c", Target: "dns"}}},
	}}
	Join(r, func(n string) bool { return true })
	assert.DeepEqual(t, r.Verdicts(), map[string]Verdict{"D6": Escaped, "D2": Sealed, "D9e": Residual})
	assert.Assert(t, *r.Checks[0].Nonces[0].Canary)
	// Positive: with no hits nothing changes.
	r2 := &Report{Schema: 1, Checks: []Check{{ID: "D6", Verdict: Sealed, Nonces: []Attempt{{Nonce: "a"}}}}}
	Join(r2, func(string) bool { return false })
	assert.Equal(t, r2.Checks[0].Verdict, Sealed)
}

func TestWriteTable(t *testing.T) {
	var plain, color bytes.Buffer
	assert.NilError(t, WriteTable(&plain, sample(), false))
	assert.NilError(t, WriteTable(&color, sample(), true))
	assert.Assert(t, !strings.Contains(plain.String(), "\x1b["))
	assert.Assert(t, is.Contains(color.String(), "\x1b[1;31mescaped"))
	assert.Assert(t, is.Contains(plain.String(), "4 checks: 1 sealed, 1 escaped, 1 residual, 1 error"))
	assert.Assert(t, is.Contains(plain.String(), "ESCAPED: x"))
}

func TestBatteryCoversTheTable(t *testing.T) {
	var ids []string
	for _, c := range battery() {
		ids = append(ids, c.id)
	}
	want := "A1 A2 A3 A4 A5 A6 A7 B1 B2 B3 B4 B5 B6 B7 B8 B9 B10 B11 C1 C2 C3 C4 D1 D2 D3 D4 D5 D6 D7 D8 D9a D9b D9c D9d D9e D9f D10 D11 D12 D13 D14 D15"
	assert.Equal(t, strings.Join(ids, " "), want)
}

// The shipped profile keeps podman's structure and denies what agents do
// not need.
func TestSeccompProfile(t *testing.T) {
	b, err := os.ReadFile("../seccomp/shrooms.json")
	assert.NilError(t, err)
	var prof struct {
		DefaultAction string `json:"defaultAction"`
		Syscalls      []struct {
			Names    []string          `json:"names"`
			Action   string            `json:"action"`
			ErrnoRet int               `json:"errnoRet"`
			Args     []json.RawMessage `json:"args"`
		} `json:"syscalls"`
	}
	assert.NilError(t, json.Unmarshal(b, &prof))
	assert.Equal(t, prof.DefaultAction, "SCMP_ACT_ERRNO")
	uncond := map[string]bool{}
	denied := map[string]int{}
	for _, s := range prof.Syscalls {
		for _, n := range s.Names {
			if s.Action == "SCMP_ACT_ALLOW" && len(s.Args) == 0 {
				uncond[n] = true
			}
			if s.Action == "SCMP_ACT_ERRNO" && len(s.Args) == 0 {
				denied[n] = s.ErrnoRet
			}
		}
	}
	for _, n := range []string{"unshare", "clone", "clone3", "keyctl", "add_key", "request_key", "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open", "userfaultfd", "ptrace", "mount", "umount2", "pivot_root"} {
		assert.Check(t, !uncond[n], "%s is allowed unconditionally", n)
	}
	assert.Equal(t, denied["clone3"], 38, "clone3 must fail with ENOSYS so libc falls back to clone")
	assert.Equal(t, denied["keyctl"], 1)
	for _, n := range []string{"read", "write", "openat", "epoll_wait", "execve"} {
		assert.Check(t, uncond[n], "%s must stay allowed", n)
	}
	// ioctl is allowed for every request but TIOCSTI, by per-bit rules
	// (pkg/seccomp's TestIoctlTIOCSTIDenied evaluates them): an
	// unconditional allow would win over the deny in libseccomp.
	assert.Check(t, !uncond["ioctl"], "ioctl is allowed unconditionally, TIOCSTI included")
	// socket is allowed by family (pkg/seccomp's tests evaluate every
	// family); here: one unconditional rule per allowed family.
	families := map[string]bool{}
	for _, s := range prof.Syscalls {
		if slices.Contains(s.Names, "socket") && s.Action == "SCMP_ACT_ALLOW" {
			assert.Assert(t, len(s.Args) > 0, "socket is allowed for every family")
			var a struct {
				Index int    `json:"index"`
				Value int    `json:"value"`
				Op    string `json:"op"`
			}
			assert.NilError(t, json.Unmarshal(s.Args[0], &a))
			assert.Check(t, a.Index == 0 && a.Op == "SCMP_CMP_EQ", "socket rule %v", a)
			families[strconv.Itoa(a.Value)] = true
		}
	}
	assert.Check(t, !uncond["socket"], "socket is allowed unconditionally")
	assert.DeepEqual(t, families, map[string]bool{"1": true, "2": true, "10": true, "16": true})
}

// B10 flips to sealed only when the cage's kernel is not the host's (a
// gVisor Sentry answers uname with a release of its own); on the host's
// kernel it never does.
func TestKernelInfoJudgesTheHostKernel(t *testing.T) {
	// (The sealed side needs a kernel of the cage's own: runsc_test.go.)
	var shared Check
	checkKernelInfo(context.Background(), Params{HostKernel: kernelRelease()}, &shared)
	assert.Assert(t, shared.Verdict == Residual || shared.Verdict == Escaped, "%+v", shared)
	var unknown Check
	checkKernelInfo(context.Background(), Params{}, &unknown)
	assert.Equal(t, unknown.Verdict, shared.Verdict, "without the host's release B10 judges as before")
}
