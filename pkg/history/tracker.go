package history

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Mode is gateway.NAME.history.
type Mode string

// The modes.
const (
	// Refuse ends the turn on a mismatch before the provider gets the
	// request (the default).
	Refuse Mode = "refuse"
	// Report forwards a mismatched history and records it.
	Report Mode = "report"
	// Off neither checks nor pins.
	Off Mode = "off"
)

// Verdicts of a session in one turn.
const (
	VerdictNew       = "new"
	VerdictContinued = "continued"
	VerdictCompacted = "compacted"
	VerdictMismatch  = "mismatch"
)

// SessionReport is one session's history in a turn, for `run --json`.
type SessionReport struct {
	Session string `json:"session"`
	// Messages is the number of messages pinned at the end of the turn.
	Messages int    `json:"messages"`
	Verdict  string `json:"verdict"`
	// Index and Role name the first message that differs from the pinned
	// history (verdict mismatch).
	Index *int   `json:"index,omitempty"`
	Role  string `json:"role,omitempty"`
}

// Mismatch is a request whose history is not the pinned one.
type Mismatch struct {
	Session string
	Index   int
	Role    string
	Why     string
}

func (m *Mismatch) Error() string {
	return fmt.Sprintf("the history of session %s differs from the one the model saw at message %d (%s): %s", m.Session, m.Index, m.Role, m.Why)
}

// Tracker pins the sessions of one task, for one turn. It is safe for
// concurrent use.
type Tracker struct {
	dir  string
	mode Mode

	mu       sync.Mutex
	sessions map[string]*session
	order    []string
	// preloaded are sessions Preload read, not yet met in this turn.
	preloaded map[string]*session
}

// NewTracker returns a tracker keeping its pins in dir (the task's state,
// never mounted in a cage).
func NewTracker(dir string, mode Mode) *Tracker {
	return &Tracker{dir: dir, mode: mode, sessions: map[string]*session{}, preloaded: map[string]*session{}}
}

// session is one provider session as this turn has seen it.
type session struct {
	id string
	// ref is the history a request must extend: the pin, then the last
	// request forwarded with its answer.
	ref                 []Message
	answered, delivered bool
	// lastUser holds the digests of the content blocks of ref's last
	// message when it is a user message with no answer after it: the
	// client may merge new content into it.
	lastUser []Digest
	pinned   bool // ref came from a pin (or this turn forwarded one)

	verdict string
	index   int
	role    string

	// refSums are the SHA-256 digests of ref's messages' raw bytes as the
	// client last sent them (zero for an answer the gateway reassembled):
	// kept in the pin for the next turn's first request.
	refSums []Digest

	// The last forwarded request's raw messages, their digests and the
	// digests of their raw bytes: a message whose bytes did not change is
	// not canonicalised again.
	lastBody  []byte
	lastSpans []span
	lastRaw   [][]byte
	lastMsgs  []Message
	lastSums  []Digest

	// store writes the pin; heads are the chain heads of chained (the
	// history last pinned).
	store   *pinStore
	heads   []Digest
	chained []Message

	// known maps the SHA-256 of a message's raw bytes, as this session's
	// pin recorded them, to the message's canonical digest: on a turn's
	// first request a message the client sends byte for byte as before is
	// not canonicalised again. The canonical form is a function of the
	// bytes, so equal raw digests mean equal canonical digests. Loaded
	// from this session's own pin only.
	known map[Digest]Message

	// compaction is the last compaction the gateway passed a summary back
	// for: the next history may be the one derived from it.
	compaction *compaction

	// answerRaw is the answer that extended ref (in memory, this turn
	// only): opencode's compaction renders it.
	answerRaw []byte
}

// Exchange is one checked request: the gateway forwards it and passes its
// answer through Answer.
type Exchange struct {
	t       *Tracker
	s       *session
	msgs    []Message
	sums    []Digest
	Answer  Answer
	tracked bool
	// compact is set when the request is a compaction request: its answer
	// is a summary, recorded instead of joining the history.
	compact *compactRequest
	// ocCompact is set when the request is an opencode compaction request
	// derived from ref (the pin it was checked against).
	ocCompact []Message
}

// Check checks one Messages request of session (its raw "messages" value)
// before it is forwarded, and pins it. main says whether the request is the
// session's conversation (it offers the agent's tools) rather than a side
// request (a title, a summary of its own). A mismatch is returned as a
// *Mismatch; under Report the exchange is still returned and the request
// may be forwarded.
func (t *Tracker) Check(sessionID string, messages []byte, main bool) (*Exchange, error) {
	if !main {
		if text, ok := ocCompactionText(messages); ok && strings.HasPrefix(sessionID, "opencode:") {
			return t.ocCheck(sessionID, text)
		}
		return &Exchange{t: t}, nil
	}
	if !validSession(sessionID) {
		return nil, &Mismatch{Session: printable(sessionID), Index: 0, Role: "-", Why: "the session id is not one the gateway can pin"}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s, err := t.session(sessionID)
	if err != nil {
		return nil, err
	}
	spans, reused, err := splitSpans(messages, s.lastBody, s.lastSpans)
	if err != nil {
		return nil, &Mismatch{Session: sessionID, Index: 0, Role: "-", Why: err.Error()}
	}
	elems := elements(messages, spans)
	msgs := make([]Message, len(elems))
	sums := make([]Digest, len(elems))
	var last canonical // the last message's canonical form, made once
	for i, e := range elems {
		if i < reused || i < len(s.lastRaw) && bytes.Equal(e, s.lastRaw[i]) {
			msgs[i], sums[i] = s.lastMsgs[i], s.lastSums[i]
			continue
		}
		sums[i] = sha256.Sum256(e)
		if m, ok := s.known[sums[i]]; ok {
			msgs[i] = m
			continue
		}
		if i == len(elems)-1 {
			last = canonicalOf(e, i)
			if msgs[i], err = last.sum(); err != nil {
				return nil, &Mismatch{Session: sessionID, Index: i, Role: "-", Why: err.Error()}
			}
			continue
		}
		if msgs[i], err = Sum(e); err != nil {
			return nil, &Mismatch{Session: sessionID, Index: i, Role: "-", Why: err.Error()}
		}
	}
	if last.raw == nil && len(elems) > 0 {
		last = canonical{raw: elems[len(elems)-1], index: len(elems) - 1, lazy: true}
	}
	first := s.verdict == ""
	if req := s.compactionRequest(msgs, elems, &last); req != nil {
		// The pin stays the history it extends; the summary is recorded
		// when it has passed back whole (Done).
		if first {
			s.verdict = VerdictContinued
		}
		s.remember(messages, spans, elems, msgs, sums)
		return &Exchange{t: t, s: s, msgs: msgs, sums: sums, tracked: true, compact: req}, nil
	}
	mm := s.compare(msgs, elems, &last)
	compacted := false
	if mm != nil && s.compaction != nil {
		if s.compacted(msgs, elems) {
			mm, compacted = nil, true
		} else {
			mm.Why += ", nor the compaction derived from the recorded summary"
		}
	}
	switch {
	case mm != nil:
		s.verdict, s.index, s.role = VerdictMismatch, mm.Index, mm.Role
		if t.mode != Report {
			return nil, mm
		}
	case compacted:
		s.verdict = VerdictCompacted
		s.compaction = nil
	case first && s.pinned:
		s.verdict = VerdictContinued
	case first:
		s.verdict = VerdictNew
	}
	// Pinned before it is forwarded: after a kill the pin is the last
	// history forwarded in full (or the one before it).
	s.ref, s.refSums, s.answered, s.delivered, s.pinned = msgs, sums, false, false, true
	s.answerRaw = nil
	s.lastUser = nil
	if n := len(msgs); n > 0 && msgs[n-1].Role == "user" {
		s.lastUser = last.blocks()
	}
	s.remember(messages, spans, elems, msgs, sums)
	if err := s.store.save(s.pin()); err != nil {
		return nil, err
	}
	ex := &Exchange{t: t, s: s, msgs: msgs, sums: sums, tracked: true}
	if mm != nil {
		return ex, mm
	}
	return ex, nil
}

// Done records the end of an exchange: the answer, when it arrived whole,
// joins the pinned history; delivered says whether the agent read it all.
func (ex *Exchange) Done(delivered bool) error {
	if ex == nil || !ex.tracked {
		return nil
	}
	raw, err := ex.Answer.assistant()
	if err != nil {
		return nil // no answer: the pin stays the request's history
	}
	if ex.compact != nil {
		return ex.compactionDone(raw)
	}
	if ex.ocCompact != nil {
		return ex.ocDone(raw)
	}
	m, err := Sum(raw)
	if err != nil {
		return nil
	}
	t := ex.t
	t.mu.Lock()
	defer t.mu.Unlock()
	s := ex.s
	// Only the answer to the session's latest request extends it.
	if len(s.ref) != len(ex.msgs) || s.answered || !slices.Equal(s.ref, ex.msgs) {
		return nil
	}
	s.ref = append(slices.Clip(ex.msgs), m)
	s.refSums = append(slices.Clip(ex.sums), Digest{})
	s.answered, s.delivered, s.lastUser = true, delivered, nil
	s.answerRaw = raw
	return s.store.save(s.pin())
}

// compactionDone records a compaction request's summary: the session's
// next history may be the one Claude Code derives from it.
func (ex *Exchange) compactionDone(answer []byte) error {
	text, ok := summaryText(answer)
	if !ok {
		return nil // not a summary: a compacted history will not match
	}
	t := ex.t
	t.mu.Lock()
	defer t.mu.Unlock()
	s := ex.s
	if !slices.Equal(s.ref, ex.compact.ref) {
		return nil // the session moved on meanwhile
	}
	s.compaction = &compaction{
		summary: sha256.Sum256([]byte(formatSummary(text))),
		tools:   ex.compact.tools,
		tail:    ex.compact.tail,
		context: ex.compact.context,
	}
	if s.verdict != VerdictMismatch {
		s.verdict = VerdictCompacted
	}
	return s.store.save(s.pin())
}

// remember keeps a forwarded request's messages: the next request is
// compared with their bytes.
func (s *session) remember(body []byte, spans []span, elems [][]byte, msgs []Message, sums []Digest) {
	s.lastBody, s.lastSpans, s.lastRaw, s.lastMsgs, s.lastSums = body, spans, elems, msgs, sums
}

func (s *session) pin() *Pin {
	// The chain heads of the messages ref shares with the last pin's are
	// kept: a request extends its history, so only new links are hashed.
	k := firstDiff(s.chained, s.ref)
	s.heads = chainHeads(s.heads[:k], s.ref)
	s.chained = s.ref
	p := newPin(s.id, s.ref, s.refSums, chainHex(s.heads), s.answered, s.delivered)
	if c := s.compaction; c != nil {
		p.Compaction = &pinCompaction{Summary: hex.EncodeToString(c.summary[:]), Tools: c.tools, Tail: pinned(c.tail), Opencode: c.opencode}
		for _, d := range c.context {
			p.Compaction.Context = append(p.Compaction.Context, hex.EncodeToString(d[:]))
		}
	}
	for _, d := range s.lastUser {
		p.LastUser = append(p.LastUser, hex.EncodeToString(d[:]))
	}
	return p
}

// session returns the session, loading its pin on first sight.
func (t *Tracker) session(id string) (*session, error) {
	if s, ok := t.sessions[id]; ok {
		return s, nil
	}
	s, ok := t.preloaded[id]
	if !ok {
		var err error
		if s, err = loadSession(t.dir, id); err != nil {
			return nil, err
		}
	}
	delete(t.preloaded, id)
	t.sessions[id] = s
	t.order = append(t.order, id)
	return s, nil
}

// loadSession reads session id's pin (and the last turn's kept request).
func loadSession(dir, id string) (*session, error) {
	s := &session{id: id, store: &pinStore{dir: dir, session: id}}
	p, err := s.store.load()
	if err != nil || p == nil {
		return s, err
	}
	if s.ref, s.heads, s.known, err = p.messages(); err != nil {
		return nil, fmt.Errorf("history pin of session %s: %w", id, err)
	}
	s.chained = s.ref
	s.answered, s.delivered, s.pinned = p.Answered, p.Delivered, true
	loadRaw(dir, s)
	if s.compaction, err = p.compaction(); err != nil {
		return nil, fmt.Errorf("history pin of session %s: %w", id, err)
	}
	for _, h := range p.LastUser {
		var d Digest
		if b, err := hex.DecodeString(h); err == nil && len(b) == len(d) {
			copy(d[:], b)
			s.lastUser = append(s.lastUser, d)
		}
	}
	return s, nil
}

// preloadSessions is how many of the task's most recently pinned sessions
// Preload reads: a resumed session is most often the last one.
const preloadSessions = 2

// Preload reads the pins of the task's most recently pinned sessions in
// the background, while the cage starts, so that a turn's first request
// does not wait for them; the channel is closed when done. A session it
// did not read, or read with an error, is read on its first request as
// before.
func (t *Tracker) Preload() <-chan struct{} {
	done := make(chan struct{})
	if t == nil {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		for _, id := range recentSessions(t.dir, preloadSessions) {
			s, err := loadSession(t.dir, id)
			if err != nil {
				continue
			}
			t.mu.Lock()
			if _, used := t.sessions[id]; !used {
				t.preloaded[id] = s
			}
			t.mu.Unlock()
		}
	}()
	return done
}

// compare checks msgs against the session's reference history: it must
// start with it, then hold only new user content. An answer the agent may
// not have read whole may be missing; new content may be merged into a
// last user message that had no answer.
func (s *session) compare(msgs []Message, elems [][]byte, last *canonical) *Mismatch {
	ref := s.ref
	if !s.pinned {
		// A session the gateway never saw must be a new one: no answer in
		// its history.
		for i, m := range msgs {
			if !newRole(m.Role) {
				return &Mismatch{Session: s.id, Index: i, Role: m.Role, Why: "a history the gateway never forwarded"}
			}
		}
		return nil
	}
	if s.answered && !s.delivered && len(msgs) >= len(ref)-1 {
		n := len(ref) - 1
		if i := firstDiff(ref[:n], msgs); i == n && (len(msgs) == n || msgs[n] != ref[n]) {
			// The undelivered answer is not in the history.
			return newContent(s.id, msgs, n)
		}
	}
	i := firstDiff(ref, msgs)
	if i == len(ref) {
		return newContent(s.id, msgs, len(ref))
	}
	if i == len(ref)-1 && i < len(msgs) && len(s.lastUser) > 0 && msgs[i].Role == "user" {
		if got := last.blocksAt(elems, i); len(got) >= len(s.lastUser) && slices.Equal(got[:len(s.lastUser)], s.lastUser) {
			return newContent(s.id, msgs, i+1)
		}
	}
	role := "missing"
	if i < len(msgs) {
		role = msgs[i].Role
	}
	why := "it differs from the pinned history"
	if i >= len(msgs) {
		why = fmt.Sprintf("the history is shorter than the %d pinned messages", len(ref))
	}
	return &Mismatch{Session: s.id, Index: i, Role: role, Why: why}
}

// newContent checks that what follows the pinned history is new user or
// harness content: an assistant message there is one the provider never
// sent.
func newContent(session string, msgs []Message, from int) *Mismatch {
	for i := from; i < len(msgs); i++ {
		if !newRole(msgs[i].Role) && !harnessAnswers()[msgs[i].Digest] {
			return &Mismatch{Session: session, Index: i, Role: msgs[i].Role, Why: "an answer the provider never gave"}
		}
	}
	return nil
}

// harnessAnswers are the assistant messages the pinned agents write
// themselves, never the provider: Claude Code 2.1.332 inserts "No response
// requested." (model "<synthetic>") after a trailing user message when it
// resumes an interrupted turn (read from the binary's resume path,
// measured in test/agents TestHistoryHonestResumes). It carries nothing.
var harnessAnswers = sync.OnceValue(func() map[Digest]bool {
	m := map[Digest]bool{}
	for _, raw := range []string{`{"role":"assistant","content":"No response requested."}`} {
		msg, err := Sum([]byte(raw))
		if err != nil {
			panic(err)
		}
		m[msg.Digest] = true
	}
	return m
})

// newRole reports whether a message of role may be new content: the
// user's (prompts, tool results) or the harness's own system messages
// (Claude Code 2.1.332 sends its environment as a "system" message); an
// assistant message never is.
func newRole(role string) bool { return role == "user" || role == "system" }

func firstDiff(a, b []Message) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// blockDigests returns the digests of a user message's canonical content
// blocks (nil when it is not canonicalisable).
func blockDigests(raw []byte) []Digest {
	_, c, err := Canonical(raw)
	if err != nil {
		return nil
	}
	blocks, err := contentBlocks(c)
	if err != nil {
		return nil
	}
	return blocks
}

// Reports returns each session's report, in the order the turn met them.
func (t *Tracker) Reports() []SessionReport {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]SessionReport, 0, len(t.order))
	for _, id := range t.order {
		s := t.sessions[id]
		if s.verdict == "" {
			continue
		}
		r := SessionReport{Session: id, Messages: len(s.ref), Verdict: s.verdict}
		if s.verdict == VerdictMismatch {
			i := s.index
			r.Index, r.Role = &i, s.role
		}
		out = append(out, r)
	}
	return out
}

func validSession(id string) bool { return sessionID().MatchString(id) }

func printable(s string) string {
	if len(s) > 64 {
		s = s[:64]
	}
	return fmt.Sprintf("%q", s)
}
