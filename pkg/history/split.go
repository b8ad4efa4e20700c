package history

import (
	"bytes"
	"errors"
)

// splitArray returns the elements of a JSON array (raw, already known to be
// valid JSON) as slices of raw, without decoding them. Most of a history is
// string content: the scan jumps from quote to quote.
func splitArray(raw []byte) ([][]byte, error) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, errors.New("messages is not an array")
	}
	i++
	var out [][]byte
	depth := 0
	start := -1
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
					out = append(out, bytes.TrimRight(raw[start:i], " \t\r\n"))
				}
				return out, nil
			}
			depth--
		case ',':
			if depth == 0 {
				if start < 0 {
					return nil, errors.New("messages: empty element")
				}
				out = append(out, bytes.TrimRight(raw[start:i], " \t\r\n"))
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
