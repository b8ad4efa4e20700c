//go:build kubeapi

package kubeapi_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/shrooms-cage/shrooms/pkg/kube"
)

// schemaOf is the structural OpenAPI v3 schema of a Go API type, written
// from its JSON names the way the API server decodes it: every field known,
// nothing else (no x-kubernetes-preserve-unknown-fields), so a field the
// real type does not have fails strict field validation. It is how the
// CRDs of the agent-sandbox types mirrored in pkg/kube/sandbox.go are
// made; no fetched CRD text is used.
// A type it cannot express (a recursive struct, a kind with no schema)
// fails the test that asked for it.
func schemaOf(tb testing.TB, t reflect.Type) map[string]any {
	tb.Helper()
	b := &schemaBuilder{visiting: map[reflect.Type]bool{}}
	s := b.schemaFor(t)
	if b.err != nil {
		tb.Fatalf("schema of %s: %v", t, b.err)
	}
	return s
}

// schemaBuilder walks a type; err is the first type it could not express.
type schemaBuilder struct {
	visiting map[reflect.Type]bool
	err      error
}

var (
	quantityType = reflect.TypeFor[resource.Quantity]()
	intStrType   = reflect.TypeFor[intstr.IntOrString]()
	timeType     = reflect.TypeFor[metav1.Time]()
)

func (b *schemaBuilder) schemaFor(t reflect.Type) map[string]any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t {
	case quantityType, intStrType:
		return map[string]any{"x-kubernetes-int-or-string": true}
	case timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	}
	switch t.Kind() {
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Int32, reflect.Uint32, reflect.Int16, reflect.Uint16, reflect.Int8, reflect.Uint8:
		return map[string]any{"type": "integer", "format": "int32"}
	case reflect.Int, reflect.Int64, reflect.Uint, reflect.Uint64:
		return map[string]any{"type": "integer", "format": "int64"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": "string", "format": "byte"}
		}
		return map[string]any{"type": "array", "items": b.schemaFor(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": b.schemaFor(t.Elem())}
	case reflect.Struct:
		if b.visiting[t] {
			b.fail(fmt.Errorf("recursive type %s", t))
			return nil
		}
		b.visiting[t] = true
		defer delete(b.visiting, t)
		props := map[string]any{}
		b.addFields(t, props)
		return map[string]any{"type": "object", "properties": props}
	}
	b.fail(fmt.Errorf("no schema for %s (kind %s)", t, t.Kind()))
	return nil
}

func (b *schemaBuilder) fail(err error) {
	if b.err == nil {
		b.err = err
	}
}

func (b *schemaBuilder) addFields(t reflect.Type, props map[string]any) {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && (name == "" || strings.Contains(opts, "inline")) {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			b.addFields(ft, props)
			continue
		}
		if name == "" {
			name = f.Name
		}
		props[name] = b.schemaFor(f.Type)
	}
}

// crd is the CustomResourceDefinition of one agent-sandbox kind, its spec
// the schema of the mirrored Go type.
func crd(tb testing.TB, group, kind, plural string, spec reflect.Type) map[string]any {
	return map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": plural + "." + group},
		"spec": map[string]any{
			"group": group,
			"scope": "Namespaced",
			"names": map[string]any{"kind": kind, "listKind": kind + "List", "plural": plural, "singular": strings.ToLower(kind)},
			"versions": []any{map[string]any{
				"name": "v1beta1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type": "object",
					"properties": map[string]any{
						"apiVersion": map[string]any{"type": "string"},
						"kind":       map[string]any{"type": "string"},
						"metadata":   map[string]any{"type": "object"},
						"spec":       schemaOf(tb, spec),
					},
				}},
			}},
		},
	}
}

func sandboxCRDs(tb testing.TB) []map[string]any {
	return []map[string]any{
		crd(tb, "agents.x-k8s.io", "Sandbox", "sandboxes", reflect.TypeFor[kube.SandboxSpec]()),
		crd(tb, "extensions.agents.x-k8s.io", "SandboxTemplate", "sandboxtemplates", reflect.TypeFor[kube.SandboxTemplateSpec]()),
	}
}
