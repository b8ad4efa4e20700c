package profile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/BurntSushi/toml"
)

// EncodeSettings writes the owner's settings table (home.<profile>.settings)
// as the profile's settings file: TOML for a SettingsTOML profile, indented
// JSON otherwise.
func (p Profile) EncodeSettings(v map[string]any) ([]byte, error) {
	if p.SettingsTOML {
		var buf bytes.Buffer
		if err := toml.NewEncoder(&buf).Encode(v); err != nil {
			return nil, fmt.Errorf("cannot be written as TOML: %v", err)
		}
		return buf.Bytes(), nil
	}
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("cannot be written as JSON: %v", err)
	}
	return append(data, '\n'), nil
}

// CheckSettings reports whether an owner's settings file
// (home.<profile>.settings_file) is a document of the profile's format.
func (p Profile) CheckSettings(data []byte) error {
	var obj map[string]any
	if p.SettingsTOML {
		if err := toml.Unmarshal(data, &obj); err != nil {
			return fmt.Errorf("is not a TOML document: %s", strings.Join(strings.Fields(err.Error()), " "))
		}
		return nil
	}
	if err := json.Unmarshal(data, &obj); err != nil {
		return fmt.Errorf("is not a JSON object: %v", err)
	}
	return nil
}

// PolicyFiles renders the profile's managed policy files with the owner's
// extra keys (Policy), by file name: a .toml file as TOML, any other as
// indented JSON. nil for a profile without managed policy.
func (p Profile) PolicyFiles(managed map[string]any, gw Gateway) (map[string][]byte, error) {
	if p.Policy == nil || p.PolicyDir == "" {
		return nil, nil
	}
	files, err := p.Policy(managed, gw)
	if err != nil || files == nil {
		return nil, err
	}
	out := map[string][]byte{}
	for name, v := range files {
		var b []byte
		if strings.HasSuffix(name, ".toml") {
			var buf bytes.Buffer
			if err := toml.NewEncoder(&buf).Encode(v); err != nil {
				return nil, fmt.Errorf("managed policy %s: %w", name, err)
			}
			b = buf.Bytes()
		} else {
			if b, err = json.MarshalIndent(v, "", "  "); err != nil {
				return nil, fmt.Errorf("managed policy %s: %w", name, err)
			}
			b = append(b, '\n')
		}
		out[name] = b
	}
	return out, nil
}

// FilterJSON checks a small kept file (a KindFilter rule's): one JSON
// object, rebuilt through the rule's filter. It returns the bytes to write
// and the dropped keys.
func (ru *Rule) FilterJSON(data []byte, env *FilterEnv) ([]byte, []FieldDrop, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return nil, nil, errors.New("not a JSON object")
	}
	if dec.More() {
		return nil, nil, errors.New("trailing data after the JSON object")
	}
	if ru.Filter == nil {
		return nil, nil, errors.New("no allowlist for this file")
	}
	out, dropped := ru.Filter(obj, env)
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, nil, err
	}
	return append(b, '\n'), dropped, nil
}

// FilterRule is the KindFilter rule that keeps the HOME path rel, or nil
// when rel is not such a file of the keep-list (what a token may seed at
// bootstrap, or a profile seed).
func FilterRule(rules []Rule, rel string) *Rule {
	if ru := Match(rules, strings.Split(rel, "/")); ru != nil && ru.Kind == KindFilter {
		return ru
	}
	return nil
}
