package profile

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// agentImage is what scripts/build-agent-image.sh (make setup) imports.
const agentImage = "localhost/shrooms-agent:latest"

const goldenSchema = "testdata/golden/opencode-1.18.33.schema"

// dumpSchema reads the migrations and sqlite_master of the database at path.
func dumpSchema(t *testing.T, path, agent string) *pinnedSchema {
	t.Helper()
	ctx := context.Background()
	db, c, err := openSQLite(ctx, path)
	assert.NilError(t, err)
	defer db.Close()
	defer c.Close()
	objs, err := readMaster(ctx, c)
	assert.NilError(t, err)
	ids, err := queryStrings(ctx, c, `SELECT id FROM "migration" ORDER BY id`)
	assert.NilError(t, err)
	return &pinnedSchema{agent: agent, migrations: ids, objects: objs}
}

// TestPinnedOpencodeSchema runs the real opencode of the agent image once so
// that it creates its database, and checks that the pinned schema is exactly
// what that opencode makes (SHROOMS_UPDATE_GOLDEN=1 rewrites the golden file
// instead). It also checks that the image's opencode is the pinned version.
func TestPinnedOpencodeSchema(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman)
	if out, err := exec.Command("podman", "--url", itest.Socket(), "image", "exists", agentImage).CombinedOutput(); err != nil {
		t.Fatalf("agent image %s is missing (run `make setup`): %v %s", agentImage, err, out)
	}
	version := strings.TrimSpace(podman(t, "run", "--rm", "--network", "none", "--user", "1000:1000", agentImage, "opencode", "--version"))
	assert.Assert(t, regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(version), "opencode --version: %q", version)
	assert.Equal(t, "opencode "+version, pinnedOpencode,
		"the agent image's opencode is not the version whose schema is pinned (scripts/build-agent-image.sh OPENCODE_VERSION)")

	home := t.TempDir()
	assert.NilError(t, os.Chown(home, 1000, 1000))
	podman(t, "run", "--rm", "--network", "none", "--user", "1000:1000", "-e", "HOME=/home/agent",
		"-v", home+":/home/agent", agentImage, "opencode", "session", "list")
	db := filepath.Join(home, ".local/share/opencode/opencode.db")
	// Read a private copy: opencode leaves the database in WAL mode.
	dir := t.TempDir()
	for _, suffix := range []string{"", "-wal"} {
		data, err := os.ReadFile(db + suffix)
		assert.NilError(t, err)
		assert.NilError(t, os.WriteFile(filepath.Join(dir, "o.db"+suffix), data, 0o600))
	}
	got := renderSchema(dumpSchema(t, filepath.Join(dir, "o.db"), pinnedOpencode))
	if os.Getenv("SHROOMS_UPDATE_GOLDEN") == "1" {
		assert.NilError(t, os.WriteFile(goldenSchema, []byte(got), 0o644))
	}
	want, err := os.ReadFile(goldenSchema)
	assert.NilError(t, err)
	assert.Equal(t, got, string(want), "the pinned schema differs from what %s makes (SHROOMS_UPDATE_GOLDEN=1 to rewrite)", pinnedOpencode)
}

// TestPinnedSchemaParses checks the embedded golden file round-trips and
// covers every table the rebuild keeps.
func TestPinnedSchemaParses(t *testing.T) {
	p, err := parseSchema(opencodeSchemaText)
	assert.NilError(t, err)
	assert.Equal(t, p.agent, pinnedOpencode)
	assert.Equal(t, renderSchema(p), opencodeSchemaText)
	for _, tp := range append(opencodeTables, tablePlan{table: "migration"}) {
		o := p.object("table", tp.table)
		assert.Assert(t, o != nil, "pinned schema has no table %s", tp.table)
		for col := range tp.drop {
			assert.Assert(t, strings.Contains(o.sql, "`"+col+"`"), "table %s has no column %s", tp.table, col)
		}
		for col := range tp.fixed {
			assert.Assert(t, strings.Contains(o.sql, "`"+col+"`"), "table %s has no column %s", tp.table, col)
		}
	}
	for _, gone := range []string{"account", "account_state", "control_account", "credential", "permission", "workspace", "session_share", "session_input"} {
		assert.Assert(t, p.object("table", gone) != nil, "pinned schema lost table %s: review opencodeTables", gone)
	}
}

func podman(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("podman", append([]string{"--url", itest.Socket()}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	assert.NilError(t, err, "podman %s: %s", strings.Join(args, " "), errb.String())
	return out.String()
}
