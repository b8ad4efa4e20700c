//go:build kubeapi

package kubeapi_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// controlPlane is an etcd and a kube-apiserver on loopback, started by the
// test from the binaries `make kube-test` built (SHROOMS_KUBE_BIN), with a
// CA made for the run. No scheduler, controller manager or kubelet: what
// they would create (a namespace's default ServiceAccount), the test
// creates itself, as envtest does.
type controlPlane struct {
	base   string
	client *http.Client
}

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

type pki struct {
	caPEM, serverCert, serverKey, clientCert, clientKey, saKey, saPub string
}

func writePEM(t *testing.T, path, typ string, der []byte) string {
	t.Helper()
	assert.NilError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
	return path
}

// makePKI writes a CA, a serving certificate for 127.0.0.1, an admin
// client certificate (group system:masters) and a service-account key.
func makePKI(t *testing.T, dir string) pki {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		assert.NilError(t, err)
		return k
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		b, err := x509.MarshalPKCS8PrivateKey(k)
		assert.NilError(t, err)
		return b
	}
	now := time.Now()
	caKey := newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "shrooms-kubeapi-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	assert.NilError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	assert.NilError(t, err)
	issue := func(serial int64, tmpl *x509.Certificate, name string) (string, string) {
		k := newKey()
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		assert.NilError(t, err)
		return writePEM(t, filepath.Join(dir, name+".crt"), "CERTIFICATE", der), writePEM(t, filepath.Join(dir, name+".key"), "PRIVATE KEY", keyDER(k))
	}
	var p pki
	p.caPEM = writePEM(t, filepath.Join(dir, "ca.crt"), "CERTIFICATE", caDER)
	p.serverCert, p.serverKey = issue(2, &x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, "server")
	p.clientCert, p.clientKey = issue(3, &x509.Certificate{Subject: pkix.Name{CommonName: "shrooms-test-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, "client")
	sa := newKey()
	p.saKey = writePEM(t, filepath.Join(dir, "sa.key"), "PRIVATE KEY", keyDER(sa))
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	assert.NilError(t, err)
	p.saPub = writePEM(t, filepath.Join(dir, "sa.pub"), "PUBLIC KEY", pub)
	return p
}

// start runs bin with args, its output in dir/<name>.log; the cleanup ends
// it (SIGTERM, then SIGKILL) by its pid and waits for it, before dir (a
// t.TempDir registered earlier) is removed.
func start(t *testing.T, dir, name, bin string, args ...string) <-chan struct{} {
	t.Helper()
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	assert.NilError(t, err)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	assert.NilError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("%s log (tail):\n%s", name, b)
		}
	})
	return done
}

func startControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	bin := os.Getenv("SHROOMS_KUBE_BIN")
	assert.Assert(t, bin != "", "SHROOMS_KUBE_BIN (the directory holding kube-apiserver and etcd) is unset: run `make kube-test`")
	for _, b := range []string{"kube-apiserver", "etcd"} {
		_, err := os.Stat(filepath.Join(bin, b))
		assert.NilError(t, err, "run `make kube-test`, which builds it")
	}
	dir := t.TempDir()
	p := makePKI(t, dir)

	clientPort, peerPort, apiPort := freePort(t), freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	etcdDone := start(t, dir, "etcd", filepath.Join(bin, "etcd"),
		"--name=default", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL, "--unsafe-no-fsync", "--log-level=warn")
	apiDone := start(t, dir, "kube-apiserver", filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(apiPort),
		"--cert-dir="+filepath.Join(dir, "certs"),
		"--tls-cert-file="+p.serverCert, "--tls-private-key-file="+p.serverKey, "--client-ca-file="+p.caPEM,
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file="+p.saPub,
		"--service-account-signing-key-file="+p.saKey, "--service-cluster-ip-range=10.0.0.0/24",
		// No controller manages the kubernetes Service's endpoints, and a
		// loopback address may not be one.
		"--endpoint-reconciler-type=none",
		"--authorization-mode=RBAC", "--disable-admission-plugins=DefaultStorageClass")

	cert, err := tls.LoadX509KeyPair(p.clientCert, p.clientKey)
	assert.NilError(t, err)
	caPEM, err := os.ReadFile(p.caPEM)
	assert.NilError(t, err)
	pool := x509.NewCertPool()
	assert.Assert(t, pool.AppendCertsFromPEM(caPEM))
	cp := &controlPlane{
		base:   fmt.Sprintf("https://127.0.0.1:%d", apiPort),
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	began := time.Now()
	for {
		code, body, _, err := cp.do(ctx, http.MethodGet, "/readyz", nil)
		if err == nil && code == http.StatusOK {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("kube-apiserver not ready: %d %s %v", code, body, err)
		case <-apiDone:
			t.Fatalf("kube-apiserver exited (its log follows)")
		case <-etcdDone:
			t.Fatalf("etcd exited (its log follows)")
		case <-time.After(500 * time.Millisecond):
		}
	}
	t.Logf("control plane ready in %v (etcd %s, kube-apiserver %s)", time.Since(began).Round(time.Millisecond), etcdURL, cp.base)
	return cp
}

// do sends one request; it returns the status, the body and the API
// server's Warning headers.
func (cp *controlPlane) do(ctx context.Context, method, path string, body any) (int, []byte, []string, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, nil, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, cp.base+path, r)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := cp.client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header.Values("Warning"), err
}

// create POSTs obj (JSON) to the collection at path with server-side field
// validation Strict.
func (cp *controlPlane) create(ctx context.Context, path string, obj any) (int, []byte, []string, error) {
	return cp.do(ctx, http.MethodPost, path+"?fieldValidation=Strict", obj)
}

// mustCreate creates obj and fails unless it is admitted with no warning.
func (cp *controlPlane) mustCreate(t *testing.T, ctx context.Context, path string, obj any) []byte {
	t.Helper()
	code, body, warnings, err := cp.create(ctx, path, obj)
	assert.NilError(t, err)
	assert.Equal(t, code, http.StatusCreated, "POST %s: %s", path, body)
	assert.Check(t, len(warnings) == 0, "POST %s warned: %q", path, warnings)
	return body
}

// waitServed polls until path answers 200 (a CRD's resource is served).
func (cp *controlPlane) waitServed(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	for {
		code, body, _, err := cp.do(ctx, http.MethodGet, path, nil)
		if err == nil && code == http.StatusOK {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%s never served: %d %s %v", path, code, body, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func nsPath(ns, group, resource string) string {
	if group == "" {
		return "/api/v1/namespaces/" + url.PathEscape(ns) + "/" + resource
	}
	return "/apis/" + group + "/namespaces/" + url.PathEscape(ns) + "/" + resource
}
