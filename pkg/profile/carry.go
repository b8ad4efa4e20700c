package profile

import (
	"context"
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// Carry is how CarryDatabase carried a KindDatabase file into the next
// HOME.
type Carry int

const (
	// Written: rebuilt into the stage through write (or, in a dry run,
	// rebuilt for its drops alone).
	Written Carry = iota
	// CarriedUnchanged: byte for byte what the last reset wrote (the
	// rule's Unchanged); the caller links the inode as it is.
	CarriedUnchanged
	// RewrittenInPlace: the file's own inode rewritten to the result (the
	// rule's UpdateInPlace); the caller links it.
	RewrittenInPlace
)

// CarryDatabase rebuilds a KindDatabase file (fd, with its -wal walFd or
// -1) the cheapest way the rule has: carried unchanged, rewritten in
// place, updated from its state, or rebuilt in full. state is the rule's
// state directory (Update), "" when it keeps none; write writes the
// stage file from fill, nil in a dry run. size is the rewritten inode's
// (RewrittenInPlace; write counts what it writes itself). An error with
// CarriedUnchanged or RewrittenInPlace is the stage's, not the file's.
func (ru *Rule) CarryDatabase(ctx context.Context, fd, walFd int, max int64, state string, write func(fill func(io.Writer) error) error) (drops []RowDrop, how Carry, size int64, err error) {
	if write == nil {
		drops, err = ru.Rebuild(ctx, fd, walFd, max, nil)
		return drops, Written, 0, err
	}
	if state != "" && ru.Unchanged != nil && ru.Unchanged(fd, walFd, state) {
		return nil, CarriedUnchanged, 0, nil
	}
	if state != "" && ru.UpdateInPlace != nil {
		var done bool
		if drops, done, err = ru.UpdateInPlace(ctx, fd, walFd, max, state); done {
			var now unix.Stat_t
			if err := unix.Fstat(fd, &now); err != nil {
				return drops, RewrittenInPlace, 0, fmt.Errorf("stat the rewritten file: %w", err)
			}
			return drops, RewrittenInPlace, now.Size, nil
		}
		if err != nil {
			return drops, Written, 0, err
		}
	}
	err = write(func(w io.Writer) error {
		var more []RowDrop
		var rerr error
		if state != "" && ru.Update != nil {
			more, rerr = ru.Update(ctx, fd, walFd, max, state, w)
		} else {
			more, rerr = ru.Rebuild(ctx, fd, walFd, max, w)
		}
		drops = append(drops, more...)
		return rerr
	})
	return drops, Written, 0, err
}
