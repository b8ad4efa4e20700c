package worktree

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// BenchmarkHandOver hands a 100 000-file worktree (1 000 directories of
// 100 files) to the task's user, the walk in front of every turn with a
// worktree; giveBack (BenchmarkOwnershipGiveBack) is the one after it.
func BenchmarkHandOver(b *testing.B) {
	itest.Require(b, itest.Root)
	wt := b.TempDir()
	for d := 0; d < 1000; d++ {
		sub := filepath.Join(wt, fmt.Sprintf("d%04d", d))
		if err := os.Mkdir(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := 0; f < 100; f++ {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%03d", f)), nil, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		uid := 300000 + i%2 // a different owner each time: every entry changes
		if changed, err := handOver(wt, uid, uid); err != nil || !changed {
			b.Fatalf("changed %v, %v", changed, err)
		}
	}
}
