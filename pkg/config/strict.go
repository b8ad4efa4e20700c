package config

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/shrooms-cage/shrooms/pkg/profile"
)

// tableKeys refuses a scalar or array where the schema wants a table
// (`env = "FOO=1"`, `token_env = "KEY"`, `settings = "…"`): the decoder
// skips such a value silently, which would drop the owner's setting.
func tableKeys(md toml.MetaData, data []byte) *Error {
	for _, k := range md.Keys() {
		t, ok := schemaType(reflect.TypeOf(Config{}), k)
		if !ok {
			continue // unknown keys are reported as such
		}
		if t.Kind() != reflect.Map && t.Kind() != reflect.Struct {
			continue
		}
		if got := md.Type(k...); got != "Hash" {
			key := k.String()
			return &Error{Line: lineOf(data, key), Key: key, Msg: fmt.Sprintf("must be a table (e.g. %s = { … } or a [%s] section), not a %s", k[len(k)-1], key, strings.ToLower(got))}
		}
	}
	return nil
}

// schemaType follows a key path through the Config type by its toml tags
// and returns the Go type the key decodes into. Free-form maps
// (map[string]any) end the walk: anything may stand below them.
func schemaType(t reflect.Type, k toml.Key) (reflect.Type, bool) {
	for _, part := range k {
		switch t.Kind() {
		case reflect.Map:
			if t.Elem().Kind() == reflect.Interface {
				return t.Elem(), true
			}
			t = t.Elem()
		case reflect.Struct:
			if _, ok := profile.Lookup(part); ok && t == reflect.TypeOf(Home{}) {
				t = reflect.TypeOf(HomeProfile{})
				continue
			}
			f, ok := fieldByTag(t, part)
			if !ok {
				return nil, false
			}
			t = f.Type
		default:
			return nil, false
		}
	}
	return t, true
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if tag := strings.Split(f.Tag.Get("toml"), ",")[0]; tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}
