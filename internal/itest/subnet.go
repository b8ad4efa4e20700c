package itest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// SubnetDir holds one file per test subnet in use on the machine (named by
// its index, holding the reserving process's pid), shared by every test
// process of every suite running at once.
const SubnetDir = "/run/shrooms-test/subnets"

// subnetOctets are the second octets test subnets are drawn from: 10.60–
// 10.199, without podman's default network (10.88) and the first pool it
// picks from for networks created without a subnet (10.89), and without
// 10.123 (the testbed's sample private address 10.123.45.67).
func subnetOctet(k int) (int, bool) {
	o := 60 + k/250
	return o, o < 200 && o != 88 && o != 89 && o != 123
}

// Subnets reserves an IPv4 /24 and an IPv6 /64 for a test's cage network,
// unique among all test processes on the machine (two suites at once
// included) and apart from every podman network config there, and frees
// them when t ends. Podman's network configs are the machine's, and it
// refuses a network whose subnet another one has, so subnets derived from
// a pid or a name collided now and then.
func Subnets(t testing.TB) (v4, v6 string) {
	t.Helper()
	if err := os.MkdirAll(SubnetDir, 0o755); err != nil {
		t.Fatalf("test subnets: %v", err)
	}
	used := configuredSubnets()
	const n = 140 * 250
	start := rand.IntN(n)
	for i := 0; i < n; i++ {
		k := (start + i) % n
		o, ok := subnetOctet(k)
		if !ok {
			continue
		}
		v4 = fmt.Sprintf("10.%d.%d.0/24", o, k%250)
		v6 = fmt.Sprintf("fd8e:7e57:%x::/64", k)
		if used[v4] || used[v6] || !reserve(k) {
			continue
		}
		path := filepath.Join(SubnetDir, strconv.Itoa(k))
		t.Cleanup(func() { _ = os.Remove(path) })
		return v4, v6
	}
	t.Fatalf("test subnets: all %d in use (%s)", n, SubnetDir)
	return "", ""
}

// reserve creates k's file, or takes it over from a process that is gone.
func reserve(k int) bool {
	path := filepath.Join(SubnetDir, strconv.Itoa(k))
	for try := 0; try < 2; try++ {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			_, werr := fmt.Fprint(f, os.Getpid())
			cerr := f.Close()
			return werr == nil && cerr == nil
		}
		if !errors.Is(err, os.ErrExist) {
			return false
		}
		if !removeStale(path) {
			return false
		}
	}
	return false
}

// removeStale removes path if the process it names is gone. Takers hold
// one lock while they check and remove, so two cannot both see the dead
// process and one remove the other's fresh reservation.
func removeStale(path string) bool {
	lock, err := os.OpenFile(filepath.Join(SubnetDir, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return false
	}
	defer lock.Close() // releases the flock
	if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX) != nil {
		return false
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	// An empty file is one being written now: taken.
	if err != nil || pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
		return false
	}
	return os.Remove(path) == nil
}

// configuredSubnets are the subnets of the machine's podman network configs
// (netavark's JSON files), as text.
func configuredSubnets() map[string]bool {
	used := map[string]bool{}
	files, _ := filepath.Glob("/etc/containers/networks/*.json")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, part := range strings.Split(string(b), `"subnet": "`)[1:] {
			if s, _, ok := strings.Cut(part, `"`); ok {
				used[s] = true
			}
		}
	}
	return used
}
