package history

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

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
}

// pinCompaction is a recorded compaction: the digest of the formatted
// summary, the tool names the summarized history called, and the pinned
// messages the compacted history keeps verbatim.
type pinCompaction struct {
	Summary string          `json:"summary"`
	Tools   []string        `json:"tools"`
	Tail    []pinnedMessage `json:"tail"`
}

// compaction decodes the pin's recorded compaction (nil when none).
func (p *Pin) compaction() (*compaction, error) {
	pc := p.Compaction
	if pc == nil {
		return nil, nil
	}
	c := &compaction{tools: pc.Tools}
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

// chain returns the digest chain head over msgs.
func chain(msgs []Message) string {
	var h [sha256.Size]byte
	for _, m := range msgs {
		s := sha256.New()
		s.Write(h[:])
		s.Write([]byte(m.Role))
		s.Write([]byte{0})
		s.Write(m.Digest[:])
		copy(h[:], s.Sum(nil))
	}
	return hex.EncodeToString(h[:])
}

// newPin returns the pin of msgs; sums, when it has a non-zero entry for a
// message, is the digest of that message's raw bytes.
func newPin(session string, msgs []Message, sums []Digest, answered, delivered bool) *Pin {
	p := &Pin{Session: session, Answered: answered, Delivered: delivered, Chain: chain(msgs), Messages: make([]pinnedMessage, len(msgs))}
	for i, m := range msgs {
		p.Messages[i] = pinnedMessage{Role: m.Role, Digest: hex.EncodeToString(m.Digest[:])}
		if i < len(sums) && sums[i] != (Digest{}) {
			p.Messages[i].Raw = hex.EncodeToString(sums[i][:])
		}
	}
	return p
}

// messages decodes the pin, checking its chain, and returns with it the
// map from the recorded raw digests to their messages.
func (p *Pin) messages() ([]Message, map[Digest]Message, error) {
	out, err := decodeMessages(p.Messages)
	if err != nil {
		return nil, nil, err
	}
	if chain(out) != p.Chain {
		return nil, nil, errors.New("the pin's digest chain does not match its messages")
	}
	known := make(map[Digest]Message, len(out))
	for i, m := range p.Messages {
		if m.Raw == "" {
			continue
		}
		var d Digest
		b, err := hex.DecodeString(m.Raw)
		if err != nil || len(b) != len(d) {
			return nil, nil, fmt.Errorf("pinned message %d is malformed", i)
		}
		copy(d[:], b)
		known[d] = out[i]
	}
	return out, known, nil
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

// pinFile is where the pin of session lives under dir: the id itself is
// the client's, so the file is named by its digest.
func pinFile(dir, session string) string {
	s := sha256.Sum256([]byte(session))
	return filepath.Join(dir, hex.EncodeToString(s[:16])+".json")
}

// loadPin reads a session's pin; (nil, nil) when there is none.
func loadPin(dir, session string) (*Pin, error) {
	f, err := os.OpenFile(pinFile(dir, session), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("history pin of session %s: %w", session, err)
	}
	defer f.Close()
	var p Pin
	if err := json.NewDecoder(f).Decode(&p); err != nil {
		return nil, fmt.Errorf("history pin of session %s: %w", session, err)
	}
	if p.Session != session {
		return nil, fmt.Errorf("history pin of session %s names session %q", session, p.Session)
	}
	return &p, nil
}

// savePin writes a session's pin atomically (beside it, then renamed): a
// kill at any point leaves the old pin or the new one.
func savePin(dir string, p *Pin) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("history pins: %w", err)
	}
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	path := pinFile(dir, p.Session)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("history pin: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("history pin: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("history pin: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("history pin: %w", err)
	}
	return nil
}
