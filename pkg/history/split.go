package history

import (
	"bytes"
	"errors"
	"sort"
)

// span is one element of a JSON array: raw[start:end].
type span struct{ start, end int }

// splitArray returns the elements of a JSON array (raw, already known to be
// valid JSON) as slices of raw, without decoding them.
func splitArray(raw []byte) ([][]byte, error) {
	spans, _, err := splitSpans(raw, nil, nil)
	if err != nil {
		return nil, err
	}
	return elements(raw, spans), nil
}

func elements(raw []byte, spans []span) [][]byte {
	out := make([][]byte, len(spans))
	for i, sp := range spans {
		out[i] = raw[sp.start:sp.end:sp.end]
	}
	return out
}

// splitSpans returns the elements of a JSON array (raw, already known to
// be valid JSON). prev is an earlier array and prevSpans its elements: the
// elements of prev that raw repeats byte for byte from its start, with
// the byte after them (which ends them), are not scanned again; reused
// says how many of raw's first elements are those. A client resends its
// whole history each request, so a request costs one compare of it and a
// scan of what changed at its end. Most of a history is string content:
// the scan jumps from quote to quote.
func splitSpans(raw, prev []byte, prevSpans []span) (spans []span, reused int, err error) {
	p := commonPrefix(raw, prev)
	k := sort.Search(len(prevSpans), func(i int) bool { return prevSpans[i].end >= p })
	if k == 0 {
		i := skipSpace(raw, 0)
		if i >= len(raw) || raw[i] != '[' {
			return nil, 0, errors.New("messages is not an array")
		}
		spans, err = scanArray(raw, make([]span, 0, len(prevSpans)+2), i+1, -1)
		return spans, 0, err
	}
	// Resume after element k-1, as the scan of prev was there: at depth
	// 0, that element begun and ended.
	spans = append(make([]span, 0, len(prevSpans)+2), prevSpans[:k-1]...)
	spans, err = scanArray(raw, spans, prevSpans[k-1].end, prevSpans[k-1].start)
	return spans, k, err
}

// scanArray scans raw from i, inside an array at depth 0, appending its
// elements to out; start is where the current element begins (-1: none
// yet).
func scanArray(raw []byte, out []span, i, start int) ([]span, error) {
	depth := 0
	elem := func(i int) span {
		e := i
		for e > start && (raw[e-1] == ' ' || raw[e-1] == '\t' || raw[e-1] == '\r' || raw[e-1] == '\n') {
			e--
		}
		return span{start, e}
	}
	for i < len(raw) {
		c := raw[i]
		switch c {
		case '"':
			if start < 0 {
				start = i
			}
			end, ok := stringEnd(raw, i+1)
			if !ok {
				return nil, errors.New("messages: unterminated string")
			}
			i = end
			continue
		case '{', '[':
			if start < 0 {
				start = i
			}
			depth++
		case '}', ']':
			if depth == 0 {
				if c != ']' {
					return nil, errors.New("messages: unbalanced")
				}
				if start >= 0 {
					out = append(out, elem(i))
				}
				return out, nil
			}
			depth--
		case ',':
			if depth == 0 {
				if start < 0 {
					return nil, errors.New("messages: empty element")
				}
				out = append(out, elem(i))
				start = -1
			}
		case ' ', '\t', '\r', '\n':
		default:
			if start < 0 {
				start = i
			}
		}
		i++
	}
	return nil, errors.New("messages: unterminated array")
}

// commonPrefix returns the length of the longest common prefix of a and b.
func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	const chunk = 4096
	i := 0
	for i+chunk <= n && bytes.Equal(a[i:i+chunk], b[i:i+chunk]) {
		i += chunk
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// stringEnd returns the index just past the closing quote of the string
// whose contents start at i.
func stringEnd(raw []byte, i int) (int, bool) {
	for {
		j := bytes.IndexByte(raw[i:], '"')
		if j < 0 {
			return 0, false
		}
		q := i + j
		// The quote is escaped when an odd number of backslashes precede it.
		n := 0
		for k := q - 1; k >= i && raw[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, true
		}
		i = q + 1
	}
}

func skipSpace(raw []byte, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\r' || raw[i] == '\n') {
		i++
	}
	return i
}
