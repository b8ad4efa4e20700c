package podman

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// apiVersion is the libpod API version shrooms' requests name in their path,
// the one podman v5.6's bindings sent before shrooms spoke the API itself
// (a 4.x service answers it as its own).
const apiVersion = "5.6.2"

// apiError is the error body podman answers a failed request with.
type apiError struct {
	Cause    string `json:"cause"`
	Message  string `json:"message"`
	Response int    `json:"response"`
}

func (e *apiError) Error() string {
	if e.Message != "" {
		return e.Message
	}
	return e.Cause
}

// decodeError is podman's error answer as an *apiError.
func decodeError(status int, data []byte) error {
	e := &apiError{}
	if json.Unmarshal(data, e) != nil || (e.Message == "" && e.Cause == "") {
		e.Message = strings.TrimSpace(string(data))
	}
	if e.Message == "" {
		e.Message = http.StatusText(status)
	}
	e.Response = status
	return e
}

// unixTransport dials the podman socket at path for every connection.
func unixTransport(path string) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
		DisableCompression: true,
	}
}

// socketPath is the path of a unix:///path URL.
func socketPath(uri string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", fmt.Errorf("podman socket %q: %w", uri, err)
	}
	if u.Scheme != "unix" || u.Path == "" {
		return "", fmt.Errorf("podman socket %q: not a unix:///path URL", uri)
	}
	return u.Path, nil
}

// endpoint is the URL of a libpod endpoint; the path elements are escaped.
func endpoint(query url.Values, elems ...string) string {
	var b strings.Builder
	b.WriteString("http://d/v" + apiVersion + "/libpod")
	for _, e := range elems {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(e))
	}
	if len(query) > 0 {
		b.WriteByte('?')
		b.WriteString(query.Encode())
	}
	return b.String()
}

// do sends one request and decodes a successful answer into out (when out
// is not nil). An answer of 4xx or 5xx is an *apiError; a service that does
// not answer is the transport's error (see IsConnectionError), or a Lazy
// client's failed connect.
func (c *Client) do(ctx context.Context, method string, query url.Values, body io.Reader, out any, elems ...string) error {
	if err := c.connected(ctx); err != nil {
		return err
	}
	return c.send(ctx, method, query, body, out, elems...)
}

// send is do without a Lazy client's connect.
func (c *Client) send(ctx context.Context, method string, query url.Values, body io.Reader, out any, elems ...string) error {
	req, err := http.NewRequestWithContext(ctx, method, endpoint(query, elems...), body)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading podman's answer: %w", err)
	}
	if resp.StatusCode >= 400 {
		return decodeError(resp.StatusCode, data)
	}
	if out != nil && len(data) > 0 && resp.StatusCode != http.StatusNoContent {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("podman's answer to %s %s: %w", method, strings.Join(elems, "/"), err)
		}
	}
	return nil
}

// exists asks an …/exists endpoint: 204 yes, 404 no.
func (c *Client) exists(ctx context.Context, elems ...string) (bool, error) {
	err := c.do(ctx, http.MethodGet, nil, nil, nil, elems...)
	if err == nil {
		return true, nil
	}
	var ae *apiError
	if errors.As(err, &ae) && ae.Response == http.StatusNotFound {
		return false, nil
	}
	return false, err
}

// jsonBody encodes v as a request body.
func jsonBody(v any) (io.Reader, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return bytes.NewReader(b), nil
}

// jsonString encodes a query parameter podman reads as JSON (a listing's
// filters, a secret's labels): maps of strings always encode.
func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
