package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
)

// The gateway owns the request: a model request may ask the provider to act
// on the network on its side (MCP servers it connects to, web fetch and
// search, code execution in a container it runs), with the owner's key —
// an egress path around network.policy that no seal sees. The gateway parses
// each request body and refuses such capabilities unless the owner allowed
// them (gateway.NAME.allow_server_tools), and refuses betas outside an
// allowlist (a beta can switch on a capability the body does not name).

// BuiltinBetas are the anthropic-beta values the pinned agents send
// (measured through this gateway: Claude Code 2.1.332 and opencode
// 1.18.33) that grant no capability on the provider's side: request
// formats, streaming, caching, thinking and context handling.
var BuiltinBetas = []string{
	// Claude Code 2.1.332 (-p).
	"claude-code-20250219",
	// Claude Code 2.1.332 interactive (run --tty): how thinking is shown.
	"thinking-display-updates-2026-08-18",
	"interleaved-thinking-2025-05-14",
	"context-management-2025-06-27",
	"per-turn-control-2026-07-01",
	"mid-conversation-tool-changes-2026-07-01",
	"thinking-token-count-2026-05-13",
	// Tool search and programmatic calling are server tool types, refused
	// in the body unless allowed; the beta alone runs nothing.
	"advanced-tool-use-2025-11-20",
	"effort-2025-11-24",
	// Claude Code 2.1.332's compaction request (/compact, auto-compact):
	// a billing fallback, no capability on the provider's side.
	"fallback-credit-2026-06-01",
	// With a subscription sign-in, also these.
	"oauth-2025-04-20",
	"extended-cache-ttl-2025-04-11",
	// opencode 1.18.33 (ai-sdk's anthropic provider).
	"fine-grained-tool-streaming-2025-05-14",
	"structured-outputs-2025-11-13",
}

// Policy is what a turn's requests may ask of the provider beyond the
// built-in set.
type Policy struct {
	// AllowBetas are further anthropic-beta values to forward.
	AllowBetas []string
	// AllowServerTools are server-side capabilities to forward: a tool type
	// ("web_search_20250305") or its family without the date
	// ("web_search"), "mcp_servers", "container", or content blocks the
	// provider fetches: "url_sources", "file_sources".
	AllowServerTools []string
}

// refusal is why a request is not forwarded (HTTP 403).
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }

func refused(format string, a ...any) error { return &refusal{fmt.Sprintf(format, a...)} }

// checkBetas refuses an anthropic-beta value outside the allowlist.
func (p Policy) checkBetas(h http.Header) error {
	for _, v := range h.Values("Anthropic-Beta") {
		for _, b := range strings.Split(v, ",") {
			b = strings.TrimSpace(b)
			if b == "" || slices.Contains(BuiltinBetas, b) || slices.Contains(p.AllowBetas, b) {
				continue
			}
			return refused("anthropic-beta %q is not allowed (gateway.NAME.allow_betas)", printable(b))
		}
	}
	return nil
}

// allowsServer reports whether capability (a tool type, "mcp_servers" or
// "container") is allowed.
func (p Policy) allowsServer(capability string) bool {
	for _, a := range p.AllowServerTools {
		if a == capability || strings.HasPrefix(capability, a+"_") && isDate(capability[len(a)+1:]) {
			return true
		}
	}
	return false
}

// isDate reports whether s is a tool type's version suffix (YYYYMMDD).
func isDate(s string) bool {
	if len(s) != 8 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// checkBody refuses a Messages request that asks for a server-side
// capability the policy does not allow, and any body it cannot read as one
// JSON object. Keys are matched exactly; a key given twice (or twice up to
// case) is refused, so the provider cannot read a member the gateway did not.
func (p Policy) checkBody(body []byte) error {
	_, err := p.parseBody(body)
	return err
}

// requestInfo is what the history pin reads of a checked request.
type requestInfo struct {
	// messages is the raw "messages" value (nil when absent).
	messages []byte
	// tools is the number of tools offered: the agent's own loop offers
	// its tools, side requests (titles, summaries) offer none.
	tools int
	// metadata is the raw "metadata" value.
	metadata []byte
}

// parseBody is checkBody, returning what the history pin reads.
func (p Policy) parseBody(body []byte) (requestInfo, error) {
	var info requestInfo
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	err := object(dec, func(key string) error {
		switch key {
		case "mcp_servers", "container":
			if !p.allowsServer(key) {
				return refused("%q asks the provider to act on the network on its side (gateway.NAME.allow_server_tools)", key)
			}
			return skip(dec)
		case "tools":
			n, err := p.checkTools(dec)
			info.tools = n
			return err
		case "messages":
			raw, err := p.checkContent(dec, key)
			info.messages = raw
			return err
		case "system":
			_, err := p.checkContent(dec, key)
			return err
		case "metadata":
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return refused("the request body is not JSON: %s", oneLine(err))
			}
			info.metadata = raw
			return nil
		}
		return skip(dec)
	})
	if err != nil {
		return info, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return info, refused("the request body is not one JSON object")
	}
	return info, nil
}

// checkTools reads the tools array: a tool with a type other than "custom"
// runs on the provider's side.
func (p Policy) checkTools(dec *json.Decoder) (int, error) {
	t, err := dec.Token()
	if err != nil {
		return 0, refused("tools: %s", oneLine(err))
	}
	if t == nil {
		return 0, nil
	}
	if t != json.Delim('[') {
		return 0, refused("tools is not an array")
	}
	i := 0
	for ; dec.More(); i++ {
		err := object(dec, func(key string) error {
			if key != "type" {
				return skip(dec)
			}
			t, err := dec.Token()
			if err != nil {
				return refused("tools[%d].type: %s", i, oneLine(err))
			}
			typ, ok := t.(string)
			switch {
			case !ok:
				return refused("tools[%d].type is not a string", i)
			case typ == "custom" || p.allowsServer(typ):
				return nil
			}
			return refused("tools[%d] is a server tool (%q), run by the provider with the owner's key (gateway.NAME.allow_server_tools)", i, printable(typ))
		})
		if err != nil {
			return i, err
		}
	}
	if _, err := dec.Token(); err != nil {
		return i, refused("tools: %s", oneLine(err))
	}
	return i, nil
}

// Content blocks whose source the provider fetches itself: an image or a
// document by URL (a GET from the provider to any address), or by the id
// of a file in the owner's account (Files API).
var fetchedSources = map[string]string{"url": "url_sources", "file": "file_sources"}

// checkContent reads a messages or system value. Its content blocks are
// walked only when a "source" key may be there: most requests have none,
// and the walk costs several times the plain syntax check.
func (p Policy) checkContent(dec *json.Decoder, key string) ([]byte, error) {
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, refused("the request body is not JSON: %s", oneLine(err))
	}
	if !maySpellSource(raw) {
		return raw, nil
	}
	inner := json.NewDecoder(bytes.NewReader(raw))
	inner.UseNumber()
	return raw, p.walk(inner, key)
}

// maySpellSource reports whether raw (valid JSON) may hold the key
// "source": literally, or with a letter of it written as a \u escape
// (\u0073 s, \u006f o, \u0075 u, \u0072 r, \u0063 c, \u0065 e; no other
// escape decodes to a letter). Other escapes, such as a terminal colour's
// \u001b in a tool's output, do not need the walk.
func maySpellSource(raw []byte) bool {
	if bytes.Contains(raw, []byte(`"source"`)) {
		return true
	}
	for rest := raw; ; {
		i := bytes.Index(rest, []byte(`\u00`))
		if i < 0 || i+6 > len(rest) {
			return false
		}
		hi, lo := rest[i+4], rest[i+5]|0x20 // hex digits are either case
		if hi == '7' && (lo == '3' || lo == '5' || lo == '2') || hi == '6' && (lo == 'f' || lo == '3' || lo == '5') {
			return true
		}
		rest = rest[i+4:]
	}
}

// walk reads one value, refusing a "source" object whose type the provider
// fetches. Tool inputs are data, not blocks, and are not walked.
func (p Policy) walk(dec *json.Decoder, where string) error {
	t, err := dec.Token()
	if err != nil {
		return refused("%s: %s", where, oneLine(err))
	}
	switch t {
	case json.Delim('['):
		for dec.More() {
			if err := p.walk(dec, where); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil {
			return refused("%s: %s", where, oneLine(err))
		}
		return nil
	case json.Delim('{'):
		return members(dec, func(key string) error {
			switch key {
			case "input":
				return skip(dec)
			case "source":
				return p.checkSource(dec, where)
			}
			return p.walk(dec, where)
		})
	}
	return nil
}

// checkSource reads a content block's source.
func (p Policy) checkSource(dec *json.Decoder, where string) error {
	t, err := dec.Token()
	if err != nil {
		return refused("%s: %s", where, oneLine(err))
	}
	if t != json.Delim('{') {
		return refused("%s: a source that is not an object", where)
	}
	return members(dec, func(key string) error {
		if key != "type" {
			return p.walk(dec, where)
		}
		t, err := dec.Token()
		if err != nil {
			return refused("%s: %s", where, oneLine(err))
		}
		typ, ok := t.(string)
		if !ok {
			return refused("%s: a source type that is not a string", where)
		}
		if allow, fetched := fetchedSources[typ]; fetched && !p.allowsServer(allow) {
			return refused("%s: a content block of source type %q is fetched by the provider with the owner's key (gateway.NAME.allow_server_tools = [%q])", where, typ, allow)
		}
		return nil
	})
}

// object reads one JSON object from dec and calls member for each key, with
// dec at the key's value (member consumes it).
func object(dec *json.Decoder, member func(key string) error) error {
	t, err := dec.Token()
	if err != nil {
		return refused("the request body is not JSON: %s", oneLine(err))
	}
	if t != json.Delim('{') {
		return refused("a JSON object was expected")
	}
	return members(dec, member)
}

// members reads an object's members after its '{', and its '}'.
func members(dec *json.Decoder, member func(key string) error) error {
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return refused("the request body is not JSON: %s", oneLine(err))
		}
		key := t.(string) // inside an object, a key is always a string
		folded := strings.ToLower(key)
		if seen[folded] {
			return refused("key %q is given twice", printable(key))
		}
		seen[folded] = true
		if err := member(key); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil {
		return refused("the request body is not JSON: %s", oneLine(err))
	}
	return nil
}

// skip consumes one JSON value (checked for syntax, not kept).
func skip(dec *json.Decoder) error {
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return refused("the request body is not JSON: %s", oneLine(err))
	}
	return nil
}

// printable bounds and quotes a value from the request for an error message.
func printable(s string) string {
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}
