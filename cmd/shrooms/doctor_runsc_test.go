//go:build runsc

package main

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/podman"
)

// runscEnv is an env whose cages run under runsc on a private podman
// service started with flags (podman's global options).
func runscEnv(t *testing.T, flags ...string) (*itest.Env, *podman.Client) {
	return runscEnvVia(t, nil, flags...)
}

// runscEnvVia is runscEnv with the config's socket made by via from the
// service's (nil: the service's own).
func runscEnvVia(t *testing.T, via func(string) string, flags ...string) (*itest.Env, *podman.Client) {
	runsc := os.Getenv("SHROOMS_TEST_RUNSC")
	if runsc == "" {
		t.Fatal("SHROOMS_TEST_RUNSC is unset: name a static upstream runsc (make setup builds one; docs/gvisor.md)")
	}
	// Started first, so it stops after the environment's cleanup.
	svc := itest.StartServiceWith(t, append([]string{"--runtime", runsc}, flags...)...)
	e, _ := integration(t, "")
	cfg, err := os.ReadFile(e.Config)
	assert.NilError(t, err)
	uri := svc.URI
	if via != nil {
		uri = via(svc.URI)
	}
	cfg = []byte(strings.Replace(string(cfg), itest.Socket(), uri, 1))
	assert.NilError(t, os.WriteFile(e.Config, cfg, 0o600))
	withRuntime(t, e, runsc)
	client, err := podman.Connect(context.Background(), uri)
	assert.NilError(t, err)
	return e, client
}

// doctor reads the runsc flags from the podman service's command line (its
// pid from SO_PEERCRED of the socket): the profile passes; a service that
// gives runsc no --oci-seccomp fails with one line, a network other than
// host warns; and the turn refuses that service's cage before the agent
// runs (exit 122, one line), leaving no cage.
func TestRunscDoctorAndTurnCheckFlags(t *testing.T) {
	t.Run("profile", func(t *testing.T) {
		e, _ := runscEnv(t, "--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp", "--runtime-flag", "network=host")
		_, stdout, stderr := e.Shrooms("doctor")
		t.Logf("doctor:\n%s", stdout)
		assert.Check(t, is.Regexp(`(?m)^ok +oci-runtime +\S*runsc at .*: gVisor$`, stdout), stdout+stderr)
		assert.Check(t, is.Regexp(`(?m)^ok +runsc +.*/runsc knows --oci-seccomp, --platform and --network$`, stdout))
		assert.Check(t, is.Regexp(`(?m)^ok +runsc-flags +the podman service \(pid \d+\) gives runsc --platform=systrap --oci-seccomp --network=host$`, stdout))
	})
	t.Run("no oci-seccomp", func(t *testing.T) {
		e, client := runscEnv(t, "--runtime-flag", "platform=systrap")
		code, stdout, stderr := e.Shrooms("doctor")
		t.Logf("doctor:\n%s", stdout)
		assert.Check(t, is.Equal(code, ExitHostNotReady), stdout+stderr)
		assert.Check(t, is.Regexp(`(?m)^fail +runsc-flags +the podman service \(pid \d+\) gives runsc --platform=systrap: runsc runs without --oci-seccomp: it ignores the cage's seccomp profile`, stdout))
		assert.Check(t, !strings.Contains(stdout, "warn runsc-flags"), "a fail line, no warnings after it")

		task := e.Task("nosc")
		code, stdout, stderr = e.Shrooms("run", "--task", task, "--agent", "shell", "--", "-c", "echo the-agent-ran")
		assert.Check(t, is.Equal(code, ExitHostNotReady), stdout+stderr)
		assert.Check(t, !strings.Contains(stdout+stderr, "the-agent-ran"))
		assert.Check(t, is.Contains(stderr, "runsc runs without --oci-seccomp"))
		assert.Check(t, is.Equal(strings.Count(strings.TrimSpace(stderr), "\n"), 0), "one line: %q", stderr)
		assert.Check(t, is.Equal(cagesOf(e, client, task), 0))
	})
	t.Run("network sandbox", func(t *testing.T) {
		e, _ := runscEnv(t, "--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp")
		_, stdout, _ := e.Shrooms("doctor")
		assert.Check(t, is.Regexp(`(?m)^warn +runsc-flags +the podman service \(pid \d+\) gives runsc --platform=systrap --oci-seccomp: network=sandbox \(runsc's default\)`, stdout), stdout)
	})
	t.Run("proxied", func(t *testing.T) {
		// A socket whose listener is not podman (here this test's own
		// forwarder; socket activation and ssh forwards look the same):
		// doctor says it cannot read the flags, and the turn, which reads
		// them from its cage's sandbox, runs.
		e, client := runscEnvVia(t, func(uri string) string { return proxy(t, strings.TrimPrefix(uri, "unix://")) },
			"--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp", "--runtime-flag", "network=host")
		_, stdout, _ := e.Shrooms("doctor")
		assert.Check(t, is.Regexp(`(?m)^warn +runsc-flags +\S+ is served by pid \d+ \(.*\), not `+"`podman system service`"+`.*: the runsc flags cannot be read here; each turn reads them from its cage's sandbox`, stdout), stdout)
		task := e.Task("px")
		code, stdout, stderr := e.Shrooms("run", "--task", task, "--agent", "shell", "--", "-c", "echo the-agent-ran")
		assert.Check(t, is.Equal(code, 0), stdout+stderr)
		assert.Check(t, is.Contains(stdout, "the-agent-ran"))
		assert.Check(t, is.Equal(cagesOf(e, client, task), 0))
	})
}

// proxy forwards a unix socket of its own to target until the test ends
// and returns its unix:// URL.
func proxy(t *testing.T, target string) string {
	dir, err := os.MkdirTemp("", "shrooms-px")
	assert.NilError(t, err)
	path := filepath.Join(dir, "podman.sock")
	ln, err := net.Listen("unix", path)
	assert.NilError(t, err)
	t.Cleanup(func() { ln.Close(); os.RemoveAll(dir) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("unix", target)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c); u.(*net.UnixConn).CloseWrite() }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return "unix://" + path
}
