package config

import (
	"fmt"
	"path/filepath"
)

// Outbox is where the cage's /outbox lives on the host (a fresh tmpfs per
// turn at Root/<task>, moved at the turn's end to Root/.pending/<task>/<turn>),
// and the limits that the mount, the move and `collect` enforce.
type Outbox struct {
	// Root holds one outbox directory per task (Root/<task>) and the pending
	// deliveries (Root/.pending/<task>/<turn>/).
	Root string `toml:"root"`
	// Size caps the outbox mount while a turn runs (a tmpfs of this size is
	// mounted at Root/<task>), so a turn cannot fill the host's disk.
	Size Size `toml:"size"`
	// Inodes caps the number of files and directories the outbox mount holds.
	Inodes int64 `toml:"inodes"`
	// MaxFiles is how many files one move (at a turn's end) or one collect
	// takes at most; MaxTotalSize, MaxFileSize, MaxDepth and MaxNameLength
	// bound both too.
	MaxFiles int `toml:"max_files"`
	// MaxTotalSize caps the bytes one collect delivers.
	MaxTotalSize Size `toml:"max_total_size"`
	// MaxFileSize caps a single delivered file.
	MaxFileSize Size `toml:"max_file_size"`
	// MaxDepth is the deepest directory level collect descends into (1 means
	// files directly in the outbox only).
	MaxDepth int `toml:"max_depth"`
	// MaxNameLength caps one path component, in bytes.
	MaxNameLength int `toml:"max_name_length"`
	// AllowExec keeps the owner-execute bit of delivered files (mode 0755
	// instead of 0644). setuid, setgid and sticky bits are always dropped.
	AllowExec bool `toml:"allow_exec"`
	// CollectTimeout bounds the run time of one move and of one collect.
	CollectTimeout Duration `toml:"collect_timeout"`
	// MaxPending caps the bytes a task's pending deliveries (earlier turns'
	// outboxes not yet collected or released) may hold on the host's disk: a
	// turn does not start while they hold more, so turn after turn cannot
	// fill the disk through the outbox.
	MaxPending Size `toml:"max_pending"`
}

func defaultOutbox() Outbox {
	return Outbox{
		Root:           "/var/lib/shrooms/outbox",
		Size:           256 << 20,
		Inodes:         4096,
		MaxFiles:       1000,
		MaxTotalSize:   256 << 20,
		MaxFileSize:    64 << 20,
		MaxDepth:       16,
		MaxNameLength:  255,
		AllowExec:      false,
		CollectTimeout: Duration(60e9),
		MaxPending:     1 << 30,
	}
}

func (o *Outbox) validate() error {
	switch {
	case !filepath.IsAbs(o.Root) || filepath.Clean(o.Root) == "/":
		return &Error{Key: "outbox.root", Msg: "must be an absolute path other than /"}
	case o.Size < 1<<20:
		return &Error{Key: "outbox.size", Msg: "must be at least 1m"}
	case o.Inodes < 16 || o.Inodes > 1<<24:
		return &Error{Key: "outbox.inodes", Msg: fmt.Sprintf("%d is out of range 16..16777216", o.Inodes)}
	case o.MaxFiles < 1 || o.MaxFiles > 1<<20:
		return &Error{Key: "outbox.max_files", Msg: fmt.Sprintf("%d is out of range 1..1048576", o.MaxFiles)}
	case o.MaxTotalSize < 1:
		return &Error{Key: "outbox.max_total_size", Msg: "must be positive"}
	case o.MaxFileSize < 1:
		return &Error{Key: "outbox.max_file_size", Msg: "must be positive"}
	case o.MaxFileSize > o.MaxTotalSize:
		return &Error{Key: "outbox.max_file_size", Msg: fmt.Sprintf("%s exceeds outbox.max_total_size (%s)", o.MaxFileSize, o.MaxTotalSize)}
	case o.MaxDepth < 1 || o.MaxDepth > 64:
		return &Error{Key: "outbox.max_depth", Msg: fmt.Sprintf("%d is out of range 1..64", o.MaxDepth)}
	case o.MaxNameLength < 1 || o.MaxNameLength > 255:
		return &Error{Key: "outbox.max_name_length", Msg: fmt.Sprintf("%d is out of range 1..255", o.MaxNameLength)}
	case o.MaxPending < o.Size:
		return &Error{Key: "outbox.max_pending", Msg: fmt.Sprintf("%s is below outbox.size (%s): one turn's outbox could not wait to be collected", o.MaxPending, o.Size)}
	case o.CollectTimeout.Std() <= 0:
		return &Error{Key: "outbox.collect_timeout", Msg: "must be positive"}
	}
	return nil
}
