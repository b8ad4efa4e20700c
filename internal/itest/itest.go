// Package itest gates integration tests: a test that needs root, podman,
// nftables or network namespaces calls Require, which skips it on a machine
// without them, or fails it when SHROOMS_REQUIRE_INTEGRATION=1 (as in CI), so
// a missing prerequisite can never pass as a skipped check. Env is one
// integration test's world: its state dir, names, podman service, CLI,
// the one wait for a turn's teardown, and its cleanup.
package itest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// DefaultSocket is the private podman API socket that `make setup` starts.
const DefaultSocket = "unix:///run/shrooms-test/podman.sock"

// TestImage is the busybox image that `make setup` builds and imports.
const TestImage = "localhost/shrooms-test:latest"

// Required reports whether missing prerequisites must fail the test.
func Required() bool { return os.Getenv("SHROOMS_REQUIRE_INTEGRATION") == "1" }

// Need is one prerequisite.
type Need int

const (
	Root Need = iota
	Podman
	Nftables
	Netns
)

// Require skips t (or fails it in CI) unless every need is met. Under
// SHROOMS_TEST_RUNTIME it also skips a test listed as unable to pass under
// that runtime (runtimeSkip).
func Require(t testing.TB, needs ...Need) {
	t.Helper()
	skipForRuntime(t)
	for _, n := range needs {
		if err := check(n); err != nil {
			if Required() {
				t.Fatalf("integration prerequisite missing (SHROOMS_REQUIRE_INTEGRATION=1): %v", err)
			}
			t.Skipf("integration prerequisite missing: %v (set SHROOMS_REQUIRE_INTEGRATION=1 to fail instead)", err)
		}
	}
}

func check(n Need) error {
	switch n {
	case Root:
		if os.Geteuid() != 0 {
			return fmt.Errorf("not root")
		}
	case Podman:
		if os.Geteuid() != 0 {
			return fmt.Errorf("not root (rootful podman needed)")
		}
		return ping(Socket())
	case Nftables:
		if os.Geteuid() != 0 {
			return fmt.Errorf("not root (nftables needs CAP_NET_ADMIN)")
		}
		if _, err := exec.LookPath("nft"); err != nil {
			return fmt.Errorf("nft not installed")
		}
	case Netns:
		if os.Geteuid() != 0 {
			return fmt.Errorf("not root (network namespaces need CAP_SYS_ADMIN)")
		}
		if _, err := exec.LookPath("ip"); err != nil {
			return fmt.Errorf("ip (iproute2) not installed")
		}
	}
	return nil
}

// Socket is the podman API URL the integration tests use
// ($SHROOMS_TEST_PODMAN_SOCKET, default DefaultSocket).
func Socket() string {
	if s := os.Getenv("SHROOMS_TEST_PODMAN_SOCKET"); s != "" {
		return s
	}
	return DefaultSocket
}

// SocketPath is Socket without its unix:// scheme.
func SocketPath() string { return strings.TrimPrefix(Socket(), "unix://") }

func ping(url string) error {
	path := strings.TrimPrefix(url, "unix://")
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}
	resp, err := c.Get("http://d/_ping")
	if err != nil {
		return fmt.Errorf("podman API at %s does not answer (run `make setup`): %v", url, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("podman API at %s answered %s", url, resp.Status)
	}
	return nil
}

// UniqueName returns prefix plus a per-run suffix, for test-created objects
// (cages, volumes, networks, namespaces, tables) that must never collide with
// anything else on the machine.
func UniqueName(prefix string) string {
	return fmt.Sprintf("%s%d%03d", prefix, os.Getpid()%100000, time.Now().UnixNano()%1000)
}
