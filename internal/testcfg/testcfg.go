// Package testcfg builds the shrooms config that integration tests share:
// the test podman service, a private state dir and outbox, HOME volumes
// named with the test's unique prefix, the test image and small limits.
// Tests set only the keys that differ.
package testcfg

import (
	"context"
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
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
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
	// The HOME volumes carry the prefix; an Extra [home] table gets the key.
	prefix := fmt.Sprintf("volume_prefix = \"shrooms-home-%s-\"\n", c.Prefix)
	if strings.Contains(extra, "[home]\n") {
		extra = strings.Replace(extra, "[home]\n", "[home]\n"+prefix, 1)
		prefix = ""
	} else {
		prefix = "[home]\n" + prefix
	}
	fmt.Fprintf(&b, "%s[outbox]\nroot = %q\n", prefix, filepath.Join(c.Dir, "outbox"))
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

// For is c on the world of e: its podman service, directory and prefix.
func (c Config) For(e *itest.Env) Config {
	c.Socket, c.Dir, c.Prefix = e.Socket, e.Dir, e.Prefix
	return c
}

// Env is the world of one test on the shared podman service with c as its
// config (written to the env's directory and parsed), and the client the
// package's tests build their runner on. Its cleanup removes each task's
// HOME (its capped filesystem before its volume, in both mount namespaces)
// and its outbox with the real home.Store and outbox.Release.
func Env(t testing.TB, prefix string, c Config, opts ...itest.Option) (*itest.Env, *config.Config, *podman.Client) {
	t.Helper()
	itest.Require(t, itest.Root, itest.Podman)
	e := itest.New(t, prefix, opts...)
	c = c.For(e)
	e.WriteConfig(c.TOML())
	cfg := c.Parse(t, e.Config)
	client, err := podman.Connect(context.Background(), cfg.Podman.Socket)
	if err != nil {
		t.Fatalf("podman: %v", err)
	}
	e.Release = Release(cfg, client)
	return e, cfg, client
}

// Release removes a task's HOME and releases its outbox, for an Env's
// cleanup.
func Release(cfg *config.Config, eng home.Engine) func(context.Context, taskid.ID) error {
	return func(ctx context.Context, task taskid.ID) error {
		if err := home.NewStore(eng, cfg).Remove(ctx, task); err != nil {
			return fmt.Errorf("remove HOME: %w", err)
		}
		if _, err := os.Stat(cfg.Outbox.Root); err != nil {
			return nil // no outbox made
		}
		if err := outbox.Release(cfg.Outbox.Root, task); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("release outbox: %w", err)
		}
		return nil
	}
}
