package home

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/profile"
)

// PolicyMount is one directory of managed policy that the cage must mount
// read-only outside HOME, at Dest, so that settings planted in HOME during a
// turn cannot load hooks or MCP servers in that same turn (where the agent
// honours managed policy).
type PolicyMount struct {
	// Source is the host directory; Dest the cage directory to mount it at.
	Source string `json:"source"`
	Dest   string `json:"dest"`
	// Files maps each file name in Source to the sha256 of its content.
	Files map[string]string `json:"files"`
	// RootOwned: Source and its files must belong to the cage's root
	// (profile.PolicyRootOwned), set by OwnRoot.
	RootOwned bool `json:"root_owned,omitempty"`
}

// Policy is the managed policy of a turn, computed and not yet written.
type Policy struct {
	// Mounts are the read-only mounts the cage needs, with the digests of
	// the files Write puts in their Source directories.
	Mounts []PolicyMount
	// files holds each mount's file contents, by mount then file name.
	files []map[string][]byte
}

// PlanPolicy computes the managed policy of the given profiles in dir (a
// per-task directory under config state.dir), writing nothing: each
// profile's policy files (its enforced keys, the owner's home.<profile>.managed
// keys and gw's pins) in dir/<its policy dir>, mounted read-only at its
// policy destination. A profile without managed policy has none.
func PlanPolicy(dir string, cfg *config.Config, profiles []string, gw PolicyGateway) (*Policy, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("policy directory %q must be absolute", dir)
	}
	pol := &Policy{}
	for _, name := range profiles {
		prof, ok := profile.Lookup(name)
		if !ok {
			return nil, fmt.Errorf("unknown HOME profile %q", name)
		}
		data, err := prof.PolicyFiles(cfg.Home.Profile(name).Managed, gw)
		var ee *profile.EnforcedError
		if errors.As(err, &ee) {
			return nil, &config.Error{Key: "home." + name + ".managed." + ee.Key, Msg: ee.Error()}
		}
		if err != nil {
			return nil, err
		}
		if data == nil {
			continue
		}
		m := PolicyMount{Source: filepath.Join(dir, prof.PolicyDir), Dest: prof.PolicyDest, Files: map[string]string{}, RootOwned: prof.PolicyRootOwned}
		for file, b := range data {
			sum := sha256.Sum256(b)
			m.Files[file] = "sha256:" + hex.EncodeToString(sum[:])
		}
		pol.Mounts = append(pol.Mounts, m)
		pol.files = append(pol.files, data)
	}
	return pol, nil
}

// Write puts the policy's files in place: directories created if needed,
// owned by root; files world-readable (the cage user must read them) and
// replaced atomically.
func (pol *Policy) Write() error {
	for i, m := range pol.Mounts {
		if err := os.MkdirAll(m.Source, 0o755); err != nil {
			return fmt.Errorf("managed policy: %w", err)
		}
		if err := os.Chmod(m.Source, 0o755); err != nil {
			return fmt.Errorf("managed policy: %w", err)
		}
		for _, name := range slices.Sorted(maps.Keys(pol.files[i])) {
			if err := writeAtomic(filepath.Join(m.Source, name), pol.files[i][name]); err != nil {
				return fmt.Errorf("managed policy: %w", err)
			}
		}
	}
	return nil
}

// OwnRoot gives the RootOwned mounts' directories and files to the host
// ids of the cage's root, after Write. The files stay 0644 and the mount
// read-only: the agent, the cage user, still cannot change them.
func (pol *Policy) OwnRoot(uid, gid int) error {
	for i, m := range pol.Mounts {
		if !m.RootOwned {
			continue
		}
		if err := os.Lchown(m.Source, uid, gid); err != nil {
			return fmt.Errorf("managed policy: %w", err)
		}
		for _, name := range slices.Sorted(maps.Keys(pol.files[i])) {
			if err := os.Lchown(filepath.Join(m.Source, name), uid, gid); err != nil {
				return fmt.Errorf("managed policy: %w", err)
			}
		}
	}
	return nil
}

func writeAtomic(path string, data []byte) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
