package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse: any text is either a valid config or one *Error, never a
// panic; a config that parses validates.
func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("..", "..", "config.example.toml")); err == nil {
		f.Add(string(b))
	}
	f.Add("[cage]\nmemory = \"1g\"\n")
	f.Add("[gateway.x]\nupstream = \"http://h\"\ntoken = \"t\"\n[tokens]\nt = \"/t\"\n")
	f.Add("[agents.a]\ncommand = [\"x\"]\nhome = [\"shell\"]\ngateway = \"nope\"\n")
	f.Add("[network]\npolicy = \"allowlist\"\nallow = [\"1.2.3.4/33\"]\n")
	f.Fuzz(func(t *testing.T, text string) {
		c, err := Parse("fuzz.toml", []byte(text))
		if err != nil {
			if !IsConfigError(err) {
				t.Fatalf("not a config error: %T %v", err, err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed but does not validate: %v", err)
		}
	})
}
