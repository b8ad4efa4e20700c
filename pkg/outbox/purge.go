package outbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// Leftover names the first entry of the outbox root (relative to it) that
// is not the empty skeleton (the root and an empty .pending): an outbox or
// a delivery still waiting, which `shrooms purge` must not remove. "" when
// there is none or the root does not exist.
func Leftover(root string) (string, error) {
	names, err := readDir(root)
	if err != nil || len(names) == 0 {
		return "", err
	}
	for _, n := range names {
		if n.Name() != PendingDir || !n.IsDir() {
			return n.Name(), nil
		}
	}
	pending, err := readDir(filepath.Join(root, PendingDir))
	if err != nil || len(pending) == 0 {
		return "", err
	}
	return filepath.Join(PendingDir, pending[0].Name()), nil
}

// RemoveEmpty removes an outbox root that holds nothing but its skeleton,
// and only that (an entry made meanwhile makes it fail, kept).
func RemoveEmpty(root string) error {
	left, err := Leftover(root)
	if err != nil {
		return err
	}
	if left != "" {
		return fmt.Errorf("outbox %s still holds %s", root, left)
	}
	for _, d := range []string{filepath.Join(root, PendingDir), root} {
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", d, err)
		}
	}
	return nil
}

func readDir(dir string) ([]fs.DirEntry, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	return entries, nil
}
