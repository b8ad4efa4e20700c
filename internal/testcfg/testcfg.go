// Package testcfg builds the shrooms config that integration tests share:
// the test podman service, a private state dir and outbox, HOME volumes
// named with the test's unique prefix, the test image and small limits.
// Tests set only the keys that differ.
package testcfg

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/config"
)

// Config is one test's config.
type Config struct {
	// Socket is the podman service; "" is itest.Socket().
	Socket string
	// Dir holds state/ and outbox/.
	Dir string
	// Prefix names the task HOME volumes: shrooms-home-<Prefix>-<task>.
	Prefix string
	// Cage is merged over the base [cage] keys (image = itest.TestImage,
	// memory = "256m", timeout = "60s", stop_grace = "2s", and runtime =
	// itest.CageRuntime() when the suites run under another runtime); a
	// nil value drops a base key.
	Cage map[string]any
	// Network is the [network] table; nil is policy = "none".
	Network map[string]any
	// Extra is appended: further tables, or keys of [outbox] (the last
	// table) before the first table header of its own.
	Extra string
}

// TOML renders the config.
func (c Config) TOML() string {
	socket := c.Socket
	if socket == "" {
		socket = itest.Socket()
	}
	cage := map[string]any{"image": itest.TestImage, "memory": "256m", "timeout": "60s", "stop_grace": "2s"}
	// The suites' runtime (SHROOMS_TEST_RUNTIME), unless the test names one.
	if rt := itest.CageRuntime(); rt != "" {
		cage["runtime"] = rt
	}
	for k, v := range c.Cage {
		if v == nil {
			delete(cage, k)
		} else {
			cage[k] = v
		}
	}
	network := c.Network
	if network == nil {
		network = map[string]any{"policy": "none"}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n[podman]\nsocket = %q\n[state]\ndir = %q\n", socket, filepath.Join(c.Dir, "state"))
	table(&b, "cage", cage)
	table(&b, "network", network)
	// Test worktrees live on filesystems without project quotas: they run
	// uncapped (pkg/wtcap's own tests mount a filesystem that has them).
	extra := c.Extra
	if strings.Contains(extra, "[worktree]\n") {
		extra = strings.Replace(extra, "[worktree]\n", "[worktree]\nuncapped = \"allow\"\n", 1)
	} else {
		b.WriteString("[worktree]\nuncapped = \"allow\"\n")
	}
	fmt.Fprintf(&b, "[home]\nvolume_prefix = \"shrooms-home-%s-\"\n[outbox]\nroot = %q\n", c.Prefix, filepath.Join(c.Dir, "outbox"))
	b.WriteString(extra)
	return b.String()
}

func table(b *strings.Builder, name string, keys map[string]any) {
	fmt.Fprintf(b, "[%s]\n", name)
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		fmt.Fprintf(b, "%s = %s\n", k, value(keys[k]))
	}
}

func value(v any) string {
	switch v := v.(type) {
	case string:
		return strconv.Quote(v)
	case float64:
		s := strconv.FormatFloat(v, 'f', -1, 64)
		if !strings.Contains(s, ".") {
			s += ".0"
		}
		return s
	case []string:
		q := make([]string, len(v))
		for i, s := range v {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	return fmt.Sprint(v)
}

// Parse parses the config as shrooms would, failing the test on an error.
func (c Config) Parse(t testing.TB, name string) *config.Config {
	t.Helper()
	cfg, err := config.Parse(name, []byte(c.TOML()))
	if err != nil {
		t.Fatalf("test config: %v", err)
	}
	return cfg
}

// Write writes the config to Dir/config.toml and returns its path.
func (c Config) Write(t testing.TB) string {
	t.Helper()
	path := filepath.Join(c.Dir, "config.toml")
	if err := os.WriteFile(path, []byte(c.TOML()), 0o600); err != nil {
		t.Fatalf("test config: %v", err)
	}
	return path
}
