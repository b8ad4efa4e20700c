package profile

import (
	"encoding/json"
	"fmt"
	"reflect"
)

// EnforcedError is an owner's managed-policy key that would change a key
// shrooms enforces.
type EnforcedError struct {
	// Key is the policy key; Want the enforced value as JSON.
	Key, Want string
}

func (e *EnforcedError) Error() string {
	return fmt.Sprintf("is enforced by shrooms (%s) and cannot be changed", e.Want)
}

// Merge returns enforced plus the owner's extra keys; an owner key that
// would change an enforced one is an *EnforcedError.
func Merge(enforced, extra map[string]any) (map[string]any, error) {
	out := map[string]any{}
	for k, v := range extra {
		if ev, ok := enforced[k]; ok && !reflect.DeepEqual(normalize(ev), normalize(v)) {
			want, _ := json.Marshal(ev)
			return nil, &EnforcedError{Key: k, Want: string(want)}
		}
		out[k] = v
	}
	for k, v := range enforced {
		out[k] = v
	}
	return out, nil
}

// normalize maps a value through JSON so TOML and Go literals compare equal.
func normalize(v any) any {
	data, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	_ = json.Unmarshal(data, &out)
	return out
}
