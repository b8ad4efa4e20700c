package history

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/shrooms-cage/shrooms/internal/lazyre"
)

// Pin is the last accepted history of one provider session, as the state
// directory keeps it: per message its role and digest, and the chain head
// over them (h_i = SHA-256(h_{i-1} || role || digest_i)).
type Pin struct {
	Session string `json:"session"`
	// Messages is the history the gateway last forwarded in full; when
	// Answered, its last message is the provider's answer to it.
	Messages []pinnedMessage `json:"messages"`
	// Answered: the last message is an answer the gateway passed back in
	// full. Delivered: the agent read all of it (else, a turn that was
	// killed while the answer streamed, the agent may not have kept it).
	Answered  bool   `json:"answered"`
	Delivered bool   `json:"delivered"`
	Chain     string `json:"chain"`
	// LastUser are the digests of the last message's content blocks when
	// it is a user message without an answer: a client resuming after a
	// failed or killed request merges new content into it.
	LastUser []string `json:"last_user,omitempty"`
	// Compaction is a compaction summary the gateway passed back: the
	// session's next history may be the one derived from it.
	Compaction *pinCompaction `json:"compaction,omitempty"`

	// msgs and sums are the messages and their raw digests (zero: none)
	// of a pin written or read as a slot (pinstore.go); Messages is only
	// read, from a pin of the earlier JSON format.
	msgs   []Message
	sums   []Digest
	binary bool
}

// pinCompaction is a recorded compaction: the digest of the formatted
// summary, the tool names the summarized history called, and the pinned
// messages the compacted history keeps verbatim.
type pinCompaction struct {
	Summary string          `json:"summary"`
	Tools   []string        `json:"tools"`
	Tail    []pinnedMessage `json:"tail"`
	Context []string        `json:"context,omitempty"`
	// Opencode marks opencode's compaction (see opencode_compact.go).
	Opencode bool `json:"opencode,omitempty"`
}

// compaction decodes the pin's recorded compaction (nil when none).
func (p *Pin) compaction() (*compaction, error) {
	pc := p.Compaction
	if pc == nil {
		return nil, nil
	}
	c := &compaction{tools: pc.Tools, opencode: pc.Opencode}
	for _, h := range pc.Context {
		var d Digest
		if b, err := hex.DecodeString(h); err != nil || len(b) != len(d) {
			return nil, errors.New("the pin's compaction context is malformed")
		} else {
			copy(d[:], b)
		}
		c.context = append(c.context, d)
	}
	b, err := hex.DecodeString(pc.Summary)
	if err != nil || len(b) != sha256.Size {
		return nil, errors.New("the pin's compaction summary is malformed")
	}
	copy(c.summary[:], b)
	if c.tail, err = decodeMessages(pc.Tail); err != nil {
		return nil, fmt.Errorf("the pin's compaction: %w", err)
	}
	return c, nil
}

func pinned(msgs []Message) []pinnedMessage {
	out := make([]pinnedMessage, len(msgs))
	for i, m := range msgs {
		out[i] = pinnedMessage{Role: m.Role, Digest: hex.EncodeToString(m.Digest[:])}
	}
	return out
}

type pinnedMessage struct {
	Role   string `json:"role"`
	Digest string `json:"digest"`
	// Raw is the SHA-256 of the message's bytes as the client last sent
	// them (absent for an answer the gateway reassembled, and in pins
	// written before it was kept). It only spares the next turn
	// canonicalising a message sent byte for byte as before; it is not in
	// the chain: a damaged one is, but for a SHA-256 collision, the digest
	// of no message, and a message it fails to match is canonicalised.
	Raw string `json:"raw,omitempty"`
}

// chainStep is one link of the chain: SHA-256(h || role || 0 || digest).
func chainStep(h Digest, m Message) Digest {
	var buf [2*sha256.Size + 32]byte
	b := append(buf[:0], h[:]...)
	b = append(b, m.Role...)
	b = append(b, 0)
	b = append(b, m.Digest[:]...)
	return sha256.Sum256(b)
}

// chainHeads extends heads, the chain heads of msgs[:len(heads)], over
// msgs.
func chainHeads(heads []Digest, msgs []Message) []Digest {
	for i := len(heads); i < len(msgs); i++ {
		var h Digest
		if i > 0 {
			h = heads[i-1]
		}
		heads = append(heads, chainStep(h, msgs[i]))
	}
	return heads
}

// chainHex is the chain head of heads as the pin records it.
func chainHex(heads []Digest) string {
	var h Digest
	if len(heads) > 0 {
		h = heads[len(heads)-1]
	}
	return hex.EncodeToString(h[:])
}

// chain returns the digest chain head over msgs.
func chain(msgs []Message) string { return chainHex(chainHeads(nil, msgs)) }

// newPin returns the pin of msgs, whose chain head is head; sums, when
// it has a non-zero entry for a message, is the digest of that message's
// raw bytes.
func newPin(session string, msgs []Message, sums []Digest, head string, answered, delivered bool) *Pin {
	return &Pin{Session: session, Answered: answered, Delivered: delivered, Chain: head, msgs: msgs, sums: sums}
}

// entries returns the pin's messages and raw digests (zero: none), from a
// slot or from a pin of the earlier JSON format.
func (p *Pin) entries() ([]Message, []Digest, error) {
	if p.binary || p.msgs != nil {
		return p.msgs, p.sums, nil
	}
	msgs, err := decodeMessages(p.Messages)
	if err != nil {
		return nil, nil, err
	}
	sums := make([]Digest, len(msgs))
	for i, m := range p.Messages {
		if m.Raw == "" {
			continue
		}
		b, err := hex.DecodeString(m.Raw)
		if err != nil || len(b) != sha256.Size {
			return nil, nil, fmt.Errorf("pinned message %d is malformed", i)
		}
		copy(sums[i][:], b)
	}
	return msgs, sums, nil
}

// messages decodes the pin, checking its chain, and returns with it the
// chain heads and the map from the recorded raw digests to their
// messages.
func (p *Pin) messages() ([]Message, []Digest, map[Digest]Message, error) {
	out, sums, err := p.entries()
	if err != nil {
		return nil, nil, nil, err
	}
	for i, m := range out {
		if m.Role == "" {
			return nil, nil, nil, fmt.Errorf("pinned message %d is malformed", i)
		}
	}
	heads := chainHeads(make([]Digest, 0, len(out)), out)
	if chainHex(heads) != p.Chain {
		return nil, nil, nil, errors.New("the pin's digest chain does not match its messages")
	}
	known := make(map[Digest]Message, len(out))
	for i, d := range sums {
		if i < len(out) && d != (Digest{}) {
			known[d] = out[i]
		}
	}
	return out, heads, known, nil
}

func decodeMessages(pm []pinnedMessage) ([]Message, error) {
	out := make([]Message, len(pm))
	for i, m := range pm {
		b, err := hex.DecodeString(m.Digest)
		if err != nil || len(b) != sha256.Size || m.Role == "" {
			return nil, fmt.Errorf("pinned message %d is malformed", i)
		}
		out[i].Role = m.Role
		copy(out[i].Digest[:], b)
	}
	return out, nil
}

// sessionID is what a provider session id may look like to be a file name.
var sessionID = lazyre.New(`^[A-Za-z0-9_.:-]{1,128}$`)
