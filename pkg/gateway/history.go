package gateway

import (
	"errors"
	"net/http"
	"path"

	"github.com/shrooms-cage/shrooms/pkg/history"
)

// exchangeKey carries a request's history exchange to the answer's reader.
type exchangeKey struct{}

// checkHistory checks a Messages request's history against the session's
// pin (invariant 10). It returns the exchange to record the answer in, and
// the refusal to send instead of forwarding ("" to forward).
func (g *Gateway) checkHistory(r *http.Request, info requestInfo) (*history.Exchange, string) {
	if g.cfg.History == nil || r.Method != http.MethodPost || path.Clean("/"+r.URL.Path) != "/v1/messages" {
		return nil, ""
	}
	g.mu.Lock()
	ended := g.historyEnded
	g.mu.Unlock()
	if ended != "" {
		return nil, ended
	}
	session := sessionOf(r.Header)
	ex, err := g.cfg.History.Check(session, info.messages, info.tools > 0)
	var mm *history.Mismatch
	switch {
	case err == nil:
		return ex, ""
	case errors.As(err, &mm) && ex != nil:
		return ex, "" // history = "report": forwarded, recorded
	}
	reason := oneLine(err)
	g.mu.Lock()
	first := g.historyEnded == ""
	if first {
		g.historyEnded = reason
	}
	g.mu.Unlock()
	if first && g.cfg.OnHistory != nil {
		g.cfg.OnHistory(reason)
	}
	return nil, reason
}

// historyDone records the end of an exchange (its answer, if whole).
func (g *Gateway) historyDone(ex *history.Exchange, delivered bool) {
	_ = ex.Done(delivered) // a pin that cannot be written leaves the previous one
}

// HistoryReports returns the turn's sessions for `run --json`.
func (g *Gateway) HistoryReports() []history.SessionReport {
	return g.cfg.History.Reports()
}

// sessionOf names the provider session a request belongs to, from what the
// client sends (measured through this gateway): Claude Code 2.1.332 sends
// X-Claude-Code-Session-Id (the transcript's id, the same on --resume),
// opencode 1.18.33 X-Session-Id (its ses_… id, the same on --session).
// A request with neither cannot be pinned and is refused when it carries
// a conversation.
func sessionOf(h http.Header) string {
	if id := h.Get("X-Claude-Code-Session-Id"); id != "" {
		return "claude:" + id
	}
	if id := h.Get("X-Session-Id"); id != "" {
		return "opencode:" + id
	}
	return ""
}
