package worktree

import (
	"testing"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// BenchmarkIdmapProbe is what deciding the worktree's mode costs a turn:
// the gate and a trial idmapped mount (a user namespace child).
func BenchmarkIdmapProbe(b *testing.B) {
	itest.Require(b, itest.Root)
	dir := b.TempDir()
	for b.Loop() {
		if r := IdmapHostReason(dir, 4242, 4242, 52001, 52001); r != "" {
			b.Fatal(r)
		}
	}
}
