// Package docs checks that the documents the repository points to exist in
// it: every relative Markdown link in README.md and docs/, every docs/*.md
// named anywhere in the source, and no pointer to design notes that live
// outside the repository.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// files returns the repository's text files under dirs with one of exts.
func files(t *testing.T, dirs []string, exts ...string) []string {
	var out []string
	for _, d := range dirs {
		err := filepath.WalkDir(filepath.Join(root(), d), func(p string, e os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() && (e.Name() == ".git" || e.Name() == "testdata") {
				return filepath.SkipDir
			}
			for _, x := range exts {
				if !e.IsDir() && strings.HasSuffix(p, x) {
					out = append(out, p)
				}
			}
			return nil
		})
		assert.NilError(t, err)
	}
	return out
}

func TestMarkdownLinksResolve(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	docs := append(files(t, []string{"docs", "scripts", "nix"}, ".md"), filepath.Join(root(), "README.md"), filepath.Join(root(), "SECURITY.md"))
	assert.Assert(t, len(docs) > 3)
	for _, f := range docs {
		b, err := os.ReadFile(f)
		assert.NilError(t, err)
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			_, err := os.Stat(filepath.Join(filepath.Dir(f), target))
			assert.Check(t, err == nil, "%s links to %s, which is not in the repository", f, target)
		}
	}
}

func TestNamedDocumentsExist(t *testing.T) {
	docRef := regexp.MustCompile(`docs/[a-z0-9_-]+\.md`)
	src := files(t, []string{"cmd", "pkg", "internal", "scripts", "nix", "test", "docs"}, ".go", ".md", ".sh", ".nix", ".toml", ".json")
	src = append(src, filepath.Join(root(), "README.md"), filepath.Join(root(), "config.example.toml"), filepath.Join(root(), "Makefile"))
	for _, f := range src {
		b, err := os.ReadFile(f)
		assert.NilError(t, err)
		s := string(b)
		for _, ref := range docRef.FindAllString(s, -1) {
			_, err := os.Stat(filepath.Join(root(), ref))
			assert.Check(t, err == nil, "%s names %s, which is not in the repository", f, ref)
		}
		// Design notes and references that were never part of the
		// repository: a reader of a fresh clone cannot follow them.
		for _, absent := range []string{"DESIGN.md", "reference/agent-surface", "breakout-battery reference", "/work/shared"} {
			if strings.HasSuffix(f, "docs_test.go") {
				continue
			}
			assert.Check(t, !strings.Contains(s, absent), "%s points to %q, which is not in the repository", f, absent)
		}
	}
}

// TestReadmeIsAFrontPage: README.md stays a front page (what, for whom,
// how it compares, how to start); the detail lives in docs/.
func TestReadmeIsAFrontPage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root(), "README.md"))
	assert.NilError(t, err)
	lines := strings.Count(string(b), "\n")
	assert.Assert(t, lines <= 250, "README.md has %d lines; move detail to docs/", lines)
	for _, want := range []string{"## Compared with", "## Quick start", "## First real turn in five steps", "## The guarantees", "## Residual risks"} {
		assert.Assert(t, strings.Contains(string(b), want), "README.md lacks %q", want)
	}
}
