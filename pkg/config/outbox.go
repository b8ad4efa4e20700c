package config

import "path/filepath"

// Outbox is the per-task host directory mounted at /outbox in the cage.
type Outbox struct {
	// Root holds one outbox directory per task (Root/<task>).
	Root string `toml:"root"`
}

func defaultOutbox() Outbox {
	return Outbox{Root: "/var/lib/shrooms/outbox"}
}

func (o *Outbox) validate() error {
	if !filepath.IsAbs(o.Root) || filepath.Clean(o.Root) == "/" {
		return &Error{Key: "outbox.root", Msg: "must be an absolute path other than /"}
	}
	return nil
}
