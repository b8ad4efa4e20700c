package history

import (
	"bytes"
	"encoding/json"
	"errors"
	"sort"
)

// Answer reassembles the provider's answer to one request, from the
// events of a stream or from one JSON body, into the assistant message a
// client sends back in its next request.
type Answer struct {
	blocks  map[int]*answerBlock
	stopped bool // message_stop seen (stream), or a whole message read
	failed  bool
}

type answerBlock struct {
	block map[string]any
	text  bytes.Buffer // text_delta / thinking_delta / partial_json
	kind  string       // which field the deltas build
}

// Event adds one server-sent event's data.
func (a *Answer) Event(data []byte) {
	if a.failed {
		return
	}
	var ev struct {
		Type         string          `json:"type"`
		Index        int             `json:"index"`
		ContentBlock json.RawMessage `json:"content_block"`
		Delta        struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			Thinking    string `json:"thinking"`
			Signature   string `json:"signature"`
			PartialJSON string `json:"partial_json"`
		} `json:"delta"`
	}
	if json.Unmarshal(data, &ev) != nil {
		a.failed = true
		return
	}
	if a.blocks == nil {
		a.blocks = map[int]*answerBlock{}
	}
	switch ev.Type {
	case "content_block_start":
		var blk map[string]any
		dec := json.NewDecoder(bytes.NewReader(ev.ContentBlock))
		dec.UseNumber()
		if dec.Decode(&blk) != nil {
			a.failed = true
			return
		}
		a.blocks[ev.Index] = &answerBlock{block: blk}
	case "content_block_delta":
		b := a.blocks[ev.Index]
		if b == nil {
			a.failed = true
			return
		}
		switch ev.Delta.Type {
		case "text_delta":
			b.kind = "text"
			b.text.WriteString(ev.Delta.Text)
		case "thinking_delta":
			b.kind = "thinking"
			b.text.WriteString(ev.Delta.Thinking)
		case "signature_delta":
			b.block["signature"] = ev.Delta.Signature
		case "input_json_delta":
			b.kind = "input"
			b.text.WriteString(ev.Delta.PartialJSON)
		case "citations_delta":
			// Citations are provider metadata the gateway does not pin.
		default:
			a.failed = true
		}
	case "message_stop":
		a.stopped = true
	case "error":
		a.failed = true
	}
}

// Message sets the answer from a whole (non-streamed) JSON answer.
func (a *Answer) Message(body []byte) {
	var m struct {
		Type    string           `json:"type"`
		Content []map[string]any `json:"content"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if dec.Decode(&m) != nil || m.Type != "message" {
		a.failed = true
		return
	}
	a.blocks = map[int]*answerBlock{}
	for i, b := range m.Content {
		a.blocks[i] = &answerBlock{block: b}
	}
	a.stopped = true
}

// assistant returns the answer as the assistant message's raw JSON, or an
// error when the answer did not arrive whole.
func (a *Answer) assistant() ([]byte, error) {
	if a.failed || !a.stopped {
		return nil, errors.New("the answer did not arrive whole")
	}
	idx := make([]int, 0, len(a.blocks))
	for i := range a.blocks {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	content := make([]any, 0, len(idx))
	for _, i := range idx {
		b := a.blocks[i]
		switch b.kind {
		case "text":
			b.block["text"] = b.text.String()
		case "thinking":
			b.block["thinking"] = b.text.String()
		case "input":
			// Kept as sent (its keys in their order: opencode's
			// compaction renders them so); canonical digests sort them.
			var in json.RawMessage
			dec := json.NewDecoder(bytes.NewReader(b.text.Bytes()))
			if b.text.Len() == 0 {
				in = json.RawMessage(`{}`)
			} else if dec.Decode(&in) != nil {
				return nil, errors.New("a tool call's input is not JSON")
			}
			b.block["input"] = in
		}
		content = append(content, b.block)
	}
	return json.Marshal(map[string]any{"role": "assistant", "content": content})
}
