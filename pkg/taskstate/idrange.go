package taskstate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// SlotSize is the number of ids in one task's user namespace.
const SlotSize = 65536

// IDs is a task's host id range: container ids 0..SlotSize-1 map onto
// UID.. and GID.. on the host.
type IDs struct {
	Slot     int
	UID, GID uint32
}

// IDFiles are the subordinate-id files and the user whose ranges shrooms
// divides into task slots.
type IDFiles struct {
	SubUID, SubGID string
	User           string
}

// DefaultIDFiles are the system files.
func DefaultIDFiles(user string) IDFiles {
	return IDFiles{SubUID: "/etc/subuid", SubGID: "/etc/subgid", User: user}
}

// TaskIDs returns the task's id range, allocating the lowest free slot the
// first time. A task keeps its slot for good, so the files of its HOME stay
// its own; no two tasks share a slot. With allocate false nothing is written:
// an unallocated task gets the slot it would be given now.
func (s Store) TaskIDs(task taskid.ID, files IDFiles, allocate bool) (IDs, error) {
	d, err := s.Task(task)
	if err != nil {
		return IDs{}, err
	}
	return s.IDsOf(d, files, allocate)
}

// IDsOf is TaskIDs for the task whose directory (under s) is d.
func (s Store) IDsOf(d Dir, files IDFiles, allocate bool) (IDs, error) {
	task := d.Name()
	uids, err := ReadSubIDs(files.SubUID, files.User)
	if err != nil {
		return IDs{}, err
	}
	gids, err := ReadSubIDs(files.SubGID, files.User)
	if err != nil {
		return IDs{}, err
	}
	slots := int(min(uids.Count, gids.Count) / SlotSize)
	if slots == 0 {
		return IDs{}, fmt.Errorf("subordinate id range of %q holds fewer than %d ids", files.User, SlotSize)
	}
	if err := d.check(); err != nil {
		return IDs{}, err
	}
	dir := d.path
	ids := func(slot int) IDs {
		return IDs{Slot: slot, UID: uint32(uids.Start) + uint32(slot)*SlotSize, GID: uint32(gids.Start) + uint32(slot)*SlotSize}
	}
	slotFile := filepath.Join(dir, "idslot")
	if slot, ok, err := readSlot(slotFile); err != nil {
		return IDs{}, err
	} else if ok {
		if slot >= slots {
			return IDs{}, fmt.Errorf("task %q has id slot %d, beyond the %d slots of %q's range", task, slot, slots, files.User)
		}
		return ids(slot), nil
	}

	if allocate {
		// Allocate under a global lock so two new tasks never take one slot.
		if _, err := d.ensure(); err != nil {
			return IDs{}, err
		}
		lf, err := os.OpenFile(filepath.Join(s.Dir, "idslots.lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return IDs{}, fmt.Errorf("id slot lock: %w", err)
		}
		defer lf.Close()
		if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
			return IDs{}, fmt.Errorf("id slot lock: %w", err)
		}
	}
	used := map[int]bool{}
	entries, err := os.ReadDir(filepath.Join(s.Dir, "tasks"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return IDs{}, fmt.Errorf("task states: %w", err)
	}
	for _, e := range entries {
		slot, ok, err := readSlot(filepath.Join(s.Dir, "tasks", e.Name(), "idslot"))
		if err != nil {
			return IDs{}, err
		}
		if ok {
			if e.Name() == task {
				return ids(slot), nil // allocated meanwhile by another shrooms
			}
			used[slot] = true
		}
	}
	for slot := 0; slot < slots; slot++ {
		if !used[slot] {
			if !allocate {
				return ids(slot), nil
			}
			if err := writeAtomic(slotFile, []byte(strconv.Itoa(slot)+"\n")); err != nil {
				return IDs{}, fmt.Errorf("id slot: %w", err)
			}
			return ids(slot), nil
		}
	}
	return IDs{}, fmt.Errorf("all %d user-namespace slots of %q are taken; forget old tasks or widen the range", slots, files.User)
}

func readSlot(path string) (int, bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("id slot: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return 0, false, fmt.Errorf("id slot file %s is corrupt: %q", path, string(b))
	}
	return n, true, nil
}
