package gitseal

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// dangerous matches, in `git config --list` output, the keys that make git
// run or redirect code: none of them may pass checkConfig.
const dangerous = `^(include\.|includeif\.|filter\.|diff\.|merge\.|core\.(hookspath|fsmonitor|worktree|sshcommand|pager|editor|askpass|gitproxy|attributesfile|excludesfile)=|credential\.|gpg\.|alias\.|url\.|protocol\.|uploadpack\.|receive\.|sequence\.)`

// FuzzCheckConfig writes arbitrary bytes as a repository's config and reads
// it the way the sealed commit does: a config it accepts sets none of the
// keys that run code on the host (checked independently, with includes
// followed), and a refusal is one line.
func FuzzCheckConfig(f *testing.F) {
	for _, s := range []string{
		"[core]\n\trepositoryformatversion = 0\n\tbare = false\n[remote \"origin\"]\n\turl = https://example.invalid/r.git\n",
		"[core]\n\thooksPath = /tmp/h\n",
		"[include]\n\tpath = /etc/evil\n",
		"[includeIf \"gitdir:/\"]\n\tpath = x\n",
		"[remote \"a.b\"]\n\turl = x\n[filter \"lfs\"]\n\tclean = sh\n",
		"[core]\nbare = true\n",
		"[Core]\n\tFsMonitor = /bin/sh\n",
		"[remote \"x\"]\n\tpushurl\n[branch \"main.x\"]\n\tremote=origin\n",
		"[core \"sub\"]\n\tpager = x\n",
		"\xff\xfe[",
	} {
		f.Add([]byte(s))
	}
	wt := filepath.Join(f.TempDir(), "repo")
	assert.NilError(f, os.Mkdir(wt, 0o755))
	hostGit(f, wt, "init", "-q")
	l, err := Resolve(wt)
	assert.NilError(f, err)
	g, err := newGit(l, author)
	assert.NilError(f, err)
	f.Cleanup(g.close)
	cfgPath := filepath.Join(l.CommonDir, "config")
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return
		}
		assert.NilError(t, os.WriteFile(cfgPath, data, 0o644))
		err := g.checkConfig(context.Background())
		if err != nil {
			assert.Assert(t, !strings.Contains(err.Error(), "\n"), "refusal is not one line: %q", err)
			return
		}
		// Independently: what git itself would use, includes followed.
		cmd := exec.Command("git", "config", "--file", cfgPath, "--includes", "--list")
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}
		out, err := cmd.Output()
		if err != nil {
			return // git cannot read it either: no git call would run anything from it
		}
		for _, line := range strings.Split(strings.ToLower(string(out)), "\n") {
			assert.Assert(t, !matches(line), "accepted config sets %q:\n%q", line, data)
			if strings.HasPrefix(line, "core.bare=") {
				assert.Equal(t, line, "core.bare=false", "accepted a bare repository: %q", data)
			}
		}
	})
}

var dangerousRE = regexp.MustCompile(dangerous)

func matches(line string) bool { return dangerousRE.MatchString(line) }

// FuzzReadPointer: a pointer file readPointer accepts yields one non-empty
// line without NUL, and it never reads more than 4 KiB.
func FuzzReadPointer(f *testing.F) {
	for _, s := range []string{"gitdir: /srv/repo/.git/worktrees/wt\n", "gitdir: ", "gitdir: a\nb", "gitdir: x\r\n", "\x00gitdir: x", "commondir"} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "pointer")
		assert.NilError(t, os.WriteFile(p, data, 0o644))
		s, err := readPointer(p, "gitdir: ")
		if err != nil {
			assert.Assert(t, !strings.Contains(err.Error(), "\n"), "%q", err)
			return
		}
		assert.Assert(t, s != "" && !strings.ContainsAny(s, "\r\n\x00") && len(data) <= 4096, "accepted %q as %q", data, s)
		assert.Assert(t, strings.HasPrefix(string(data), "gitdir: "+s))
	})
}
