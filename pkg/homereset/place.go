package homereset

import (
	"fmt"
	"os"
	"path"
	"strings"
)

// PlaceFile writes data at rel inside the task's live HOME (after Reset,
// before the cage starts), owned by uid:gid, replacing what is there. It
// is how shrooms puts turn-specific files into HOME — the model gateway's
// placeholder credentials — without following any link the HOME holds.
func PlaceFile(root, rel string, data []byte, mode uint32, uid, gid int) error {
	if rel == "" || strings.HasPrefix(rel, "/") || path.Clean(rel) != rel || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("place %q in HOME: not a clean relative path", rel)
	}
	v, err := openVolume(root, false)
	if err != nil {
		return err
	}
	defer v.close()
	home, err := openDir(v.root, homeName, v.dev)
	if err != nil {
		return fmt.Errorf("place %s in HOME: %w", rel, err)
	}
	defer home.Close()
	if err := placeAt(home, rel, uid, gid, v.dev, func(d *os.File, name string) error {
		return writeFileAt(d, name, data, mode, uid, gid)
	}); err != nil {
		return fmt.Errorf("place %s in HOME: %w", rel, err)
	}
	return nil
}
