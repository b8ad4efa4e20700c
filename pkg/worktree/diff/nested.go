package diff

import "strings"

// nestedWhy is why a nested git repository is listed as agent config.
const nestedWhy = "a nested git repository: its config and hooks run in the owner's git"

// nestedRepoRoot returns the nested git repository rel lies in or is ("" when
// none): the first path element named .git below the worktree root
// ("sub/.git"), or a directory laid out as a git directory (HEAD with
// objects and refs, or with commondir) in either snapshot — the layouts
// the worktree's give-back leaves with the task's uid.
func nestedRepoRoot(rel string, snaps ...*Snapshot) string {
	parts := strings.Split(rel, "/")
	for i := range parts {
		prefix := strings.Join(parts[:i+1], "/")
		if i > 0 && parts[i] == ".git" {
			return prefix
		}
		for _, s := range snaps {
			if s.looksLikeGitDir(prefix) {
				return prefix
			}
		}
	}
	return ""
}

func (s *Snapshot) looksLikeGitDir(dir string) bool {
	has := func(name string) bool { return s.has(dir + "/" + name) }
	return has("HEAD") && ((has("objects") && has("refs")) || has("commondir"))
}
