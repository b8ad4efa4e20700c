package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"unicode"

	"github.com/shrooms-cage/shrooms/pkg/safetext"
)

// jsonSchema is the version of the JSON that shrooms prints (docs/json.md).
// It changes when a field changes meaning or goes away, not when one is added.
const jsonSchema = 1

// stdout is shrooms' standard output. It remembers whether the last byte
// written ended a line, so that a JSON object printed after agent output
// without a trailing newline still starts a line of its own, and whether a
// JSON object has been printed, so that an error path prints one only if
// none was.
type stdout struct {
	mu      sync.Mutex
	w       io.Writer
	n       int64
	last    byte
	printed bool
}

func (s *stdout) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.w.Write(p)
	if n > 0 {
		s.n += int64(n)
		s.last = p[n-1]
	}
	return n, err
}

// printLine prints one JSON line, on a line of its own.
func (s *stdout) printLine(b []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n > 0 && s.last != '\n' {
		if _, err := s.w.Write([]byte{'\n'}); err != nil {
			return err
		}
	}
	b = append(b, '\n')
	n, err := s.w.Write(b)
	s.n += int64(n)
	if n > 0 {
		s.last = b[n-1]
	}
	s.printed = true
	return err
}

// printJSON prints v as one line of JSON in shrooms' schema: keys in
// snake_case, durations in milliseconds (a "…Ns" nanosecond field of a
// package's report becomes "…_ms"), and a "schema" version.
func printJSON(w io.Writer, v any) error {
	b, err := schemaJSON(v)
	if err != nil {
		return fail(ExitInternal, err)
	}
	if s, ok := w.(*stdout); ok {
		return s.printLine(b)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func schemaJSON(v any) ([]byte, error) {
	emptyLists(reflect.ValueOf(v))
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("render JSON: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return nil, fmt.Errorf("render JSON: %w", err)
	}
	tree = normalize(tree)
	if m, ok := tree.(map[string]any); ok {
		if _, has := m["schema"]; !has { // the probe report carries its own
			m["schema"] = jsonSchema
		}
	}
	return json.Marshal(tree)
}

// emptyLists makes every nil slice reachable from v (through pointers,
// struct fields, interfaces, maps and slices) an empty one, so that an
// empty list prints as [] and never as null (docs/json.md).
func emptyLists(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			emptyLists(v.Elem())
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			f := v.Field(i)
			if sf := v.Type().Field(i); !sf.IsExported() && !sf.Anonymous {
				continue // encoding/json prints neither (but an embedded struct's fields)
			}
			if f.Kind() == reflect.Slice && f.IsNil() && f.CanSet() {
				f.Set(reflect.MakeSlice(f.Type(), 0, 0))
				continue
			}
			emptyLists(f)
		}
	case reflect.Slice, reflect.Array:
		for i := 0; i < v.Len(); i++ {
			emptyLists(v.Index(i))
		}
	case reflect.Map:
		iter := v.MapRange()
		for iter.Next() {
			val := iter.Value()
			if val.Kind() == reflect.Interface && !val.IsNil() {
				val = val.Elem()
			}
			if val.Kind() == reflect.Slice && val.IsNil() {
				v.SetMapIndex(iter.Key(), reflect.MakeSlice(val.Type(), 0, 0))
				continue
			}
			emptyLists(val)
		}
	}
}

// normalize rewrites object keys to snake_case and nanosecond durations
// ("durationNs") to milliseconds ("duration_ms"), and escapes every string
// and key (safetext.Escape): paths and names the cage chose reach the JSON
// with no control, format character or invalid byte in them.
func normalize(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, val := range t {
			if n, ok := val.(json.Number); ok && strings.HasSuffix(k, "Ns") && len(k) > 2 {
				if ns, err := n.Float64(); err == nil {
					out[safetext.Escape(snake(strings.TrimSuffix(k, "Ns")))+"_ms"] = ns / 1e6
					continue
				}
			}
			out[safetext.Escape(snake(k))] = normalize(val)
		}
		return out
	case []any:
		for i := range t {
			t[i] = normalize(t[i])
		}
		return t
	case string:
		return safetext.Escape(t)
	}
	return v
}

// textf prints shrooms' own text output (listings, reports), escaped by
// safetext.Text: a name in it cannot drive the terminal. Never for the
// agent's own output.
func textf(w io.Writer, format string, a ...any) {
	fmt.Fprint(w, safetext.Text(fmt.Sprintf(format, a...)))
}

// textln is textf with fmt.Sprintln.
func textln(w io.Writer, a ...any) {
	fmt.Fprint(w, safetext.Text(fmt.Sprintln(a...)))
}

// warn prints one line of shrooms' own on stderr ("shrooms: …"), escaped.
func warn(w io.Writer, msg string) {
	fmt.Fprintln(w, "shrooms: "+safetext.Escape(oneLine(msg)))
}

// snake turns a camelCase identifier into snake_case ("exitCode" →
// "exit_code", "oomKilled" → "oom_killed", "totalMs" → "total_ms"). Keys
// that are not camelCase identifiers (map keys that are data: paths, check
// ids, variable names) are left as they are.
func snake(k string) string {
	if !camel.MatchString(k) {
		return k
	}
	var b strings.Builder
	for i, r := range k {
		if unicode.IsUpper(r) {
			prevLower := i > 0 && !unicode.IsUpper(rune(k[i-1]))
			nextLower := i+1 < len(k) && unicode.IsLower(rune(k[i+1]))
			if prevLower || (nextLower && i > 0) {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(r))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

var camel = regexp.MustCompile(`^[a-z][a-zA-Z0-9]*$`)

// errorObject is what --json prints when a command fails before it has
// printed its own object (bad flags, config, podman unreachable, …).
type errorObject struct {
	Command  string `json:"command,omitempty"`
	Status   string `json:"status"`
	ExitCode int    `json:"exitCode"`
	Error    string `json:"error"`
}
