package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestKubeGatewaySidecar runs `shrooms kube gateway` as a real process, as
// the pod's sidecar does: the placeholder from the environment is the only
// credential it accepts, the key from the file is what the upstream sees,
// and SIGTERM ends it cleanly.
func TestKubeGatewaySidecar(t *testing.T) {
	var gotKey []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotKey = append(gotKey, r.Header.Get("X-Api-Key"))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"type":"message","usage":{"output_tokens":1}}`))
	}))
	defer upstream.Close()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	assert.NilError(t, os.WriteFile(keyFile, []byte("sk-real-key\n"), 0o600))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	placeholder := strings.Repeat("q", 40)

	cmd := exec.Command(os.Args[0], "kube", "gateway", "--upstream", upstream.URL, "--key-file", keyFile,
		"--placeholder-env", "PH", "--listen", addr)
	cmd.Env = append(os.Environ(), "SHROOMS_TEST_MAIN=1", "PH="+placeholder)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	assert.NilError(t, cmd.Start())
	defer cmd.Process.Kill()

	post := func(key string) int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/messages", strings.NewReader(`{}`))
		req.Header.Set("X-Api-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	deadline := time.Now().Add(10 * time.Second)
	for post(placeholder) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	assert.Equal(t, post("sk-guess"), http.StatusUnauthorized)
	assert.Equal(t, post(placeholder), http.StatusOK)
	assert.Check(t, len(gotKey) >= 1)
	for _, k := range gotKey {
		assert.Equal(t, k, "sk-real-key", "the upstream sees the real key, never the placeholder")
	}

	assert.NilError(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		assert.NilError(t, err, "stderr: %s", stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway did not stop on SIGTERM")
	}
}

func TestKubeRefusesBadInput(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.toml")
	assert.NilError(t, os.WriteFile(cfg, []byte("[cage]\nmemory = \"1g\"\n"), 0o600))
	var out, errOut bytes.Buffer
	code := run([]string{"shrooms", "--config", cfg, "kube", "--task", "a_b", "--agent", "claude"}, nil, &out, &errOut)
	assert.Equal(t, code, ExitUsage)
	assert.Check(t, is.Contains(errOut.String(), "not a Kubernetes name"))
	assert.Equal(t, out.Len(), 0, "nothing printed on error")

	out.Reset()
	errOut.Reset()
	code = run([]string{"shrooms", "--config", cfg, "kube", "--task", "t1", "--agent", "claude", "--plain"}, nil, &out, &errOut)
	assert.Equal(t, code, 0, errOut.String())
	assert.Check(t, is.Contains(out.String(), "kind: Pod\n"))
	assert.Check(t, is.Contains(out.String(), "hostUsers: false"))
	assert.Check(t, is.Contains(out.String(), "memory: 1Gi"), "the config's limits")
	assert.Check(t, is.Contains(out.String(), `config.toml: |`), "the config file travels in the ConfigMap")
}
