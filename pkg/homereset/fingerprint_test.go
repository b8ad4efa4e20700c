package homereset

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// TestFingerprintSeesEveryChange: the fingerprint a prepared turn checks
// HOME by instead of a dry-run reset is stable while nothing changes and
// changes with anything a reset would read: content rewritten at the same
// size with its mtime set back, a file created and deleted again (the
// directory's mtime set back too), a mode changed and restored, a rename
// there and back, a baseline file on the host, the config, an interrupted
// reset's journal. A change too recent to be told apart gives "".
func TestFingerprintSeesEveryChange(t *testing.T) {
	task := newTask(t, "claude", "shell")
	ctx := context.Background()
	_, err := Bootstrap(ctx, task)
	assert.NilError(t, err)
	home := HomeDir(task.Root)
	settle := func() string {
		t.Helper()
		time.Sleep(racyWindow + 10*time.Millisecond)
		fp, err := Fingerprint(ctx, task)
		assert.NilError(t, err)
		assert.Assert(t, fp != "", "settled HOME fingerprinted as racy")
		return fp
	}
	_, err = Reset(ctx, ResetInput{Task: task})
	assert.NilError(t, err)
	// Racy: right after the reset wrote HOME.
	fp, err := Fingerprint(ctx, task)
	assert.NilError(t, err)
	assert.Equal(t, fp, "", "a HOME written a moment ago must not be fingerprinted")
	base := settle()
	assert.Equal(t, settle(), base, "unchanged HOME, same fingerprint")

	kept := filepath.Join(home, ".claude/.credentials.json")
	settings := filepath.Join(home, ".claude/settings.json")
	restoreTimes := func(path string, st os.FileInfo) {
		t.Helper()
		assert.NilError(t, os.Chtimes(path, st.ModTime(), st.ModTime()))
	}
	changes := map[string]func(){
		"same-size rewrite, mtime set back": func() {
			st, err := os.Stat(kept)
			assert.NilError(t, err)
			data, err := os.ReadFile(kept)
			assert.NilError(t, err)
			data[len(data)-2] ^= 1
			assert.NilError(t, os.WriteFile(kept, data, st.Mode()))
			restoreTimes(kept, st)
		},
		"file created and deleted, directory mtime set back": func() {
			dir := filepath.Dir(settings)
			st, err := os.Stat(dir)
			assert.NilError(t, err)
			p := filepath.Join(dir, "hooks.json")
			assert.NilError(t, os.WriteFile(p, []byte("{}"), 0o644))
			assert.NilError(t, os.Remove(p))
			restoreTimes(dir, st)
		},
		"mode changed and restored": func() {
			st, err := os.Stat(settings)
			assert.NilError(t, err)
			assert.NilError(t, os.Chmod(settings, 0o666))
			assert.NilError(t, os.Chmod(settings, st.Mode()))
		},
		"renamed there and back": func() {
			assert.NilError(t, os.Rename(settings, settings+".x"))
			assert.NilError(t, os.Rename(settings+".x", settings))
		},
		"baseline file changed on the host": func() {
			p := task.Config.Home.Profile("shell").Files[".profile"]
			assert.NilError(t, os.WriteFile(p, []byte("export PATH=/tmp:/usr/bin:/bin\n"), 0o644))
		},
		"config changed": func() {
			task.Config.Home.Profile("claude").Instructions = "Work elsewhere.\n"
		},
		"interrupted reset's journal": func() {
			assert.NilError(t, os.WriteFile(filepath.Join(task.Root, metaName, journal), []byte(`{"id":"1"}`), 0o600))
		},
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			_, err := Reset(ctx, ResetInput{Task: task})
			assert.NilError(t, err)
			before := settle()
			change()
			time.Sleep(racyWindow + 10*time.Millisecond)
			after, err := Fingerprint(ctx, task)
			assert.NilError(t, err)
			assert.Assert(t, after != before, "the fingerprint missed: %s", name)
			// Undo what is outside HOME, for the next case.
			_ = os.Remove(filepath.Join(task.Root, metaName, journal))
			task.Config.Home.Profile("claude").Instructions = "Work in /work.\n"
		})
	}
}
