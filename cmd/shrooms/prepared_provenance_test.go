package main

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/seccomp"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// podmanCLI runs the podman CLI against the test service.
func podmanCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("podman", append([]string{"--url", itest.Socket()}, args...)...).CombinedOutput()
	assert.NilError(t, err, "podman %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

// markedImages imports the test image's rootfs plus a /marker file holding
// mark, under name (replacing what the name pointed at), and returns its id.
type markedImages struct {
	t      *testing.T
	name   string
	rootfs string // the test image's filesystem, exported once
	ids    []string
}

func newMarkedImages(t *testing.T) *markedImages {
	// Gated like integration(): the images are built with podman first.
	itest.Require(t, itest.Root, itest.Podman)
	m := &markedImages{t: t, name: "localhost/" + itest.UniqueName("pv") + ":latest"}
	dir := t.TempDir()
	// The test image's one layer, from a saved archive (no container is
	// made for it).
	archive := filepath.Join(dir, "image.tar")
	podmanCLI(t, "save", "--format", "docker-archive", "-o", archive, itest.TestImage)
	var manifest []struct{ Layers []string }
	assert.NilError(t, json.Unmarshal(tarEntry(t, archive, "manifest.json"), &manifest))
	assert.Equal(t, len(manifest), 1)
	assert.Equal(t, len(manifest[0].Layers), 1, "the test image has one layer")
	m.rootfs = filepath.Join(dir, "rootfs.tar")
	assert.NilError(t, os.WriteFile(m.rootfs, tarEntry(t, archive, manifest[0].Layers[0]), 0o600))
	// After every cage of the test is gone (cleanups run last first).
	t.Cleanup(func() {
		for _, id := range m.ids {
			_ = exec.Command("podman", "--url", itest.Socket(), "image", "rm", "-f", id).Run()
		}
	})
	return m
}

// tarEntry is the content of the entry named name in the tar file path.
func tarEntry(t *testing.T, path, name string) []byte {
	t.Helper()
	f, err := os.Open(path)
	assert.NilError(t, err)
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		assert.NilError(t, err, "no %s in %s", name, path)
		if h.Name == name {
			b, err := io.ReadAll(tr)
			assert.NilError(t, err)
			return b
		}
	}
}

func (m *markedImages) build(mark string) string {
	t := m.t
	src, err := os.Open(m.rootfs)
	assert.NilError(t, err)
	defer src.Close()
	path := filepath.Join(t.TempDir(), "img.tar")
	dst, err := os.Create(path)
	assert.NilError(t, err)
	tw := tar.NewWriter(dst)
	tr := tar.NewReader(src)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		assert.NilError(t, err)
		assert.NilError(t, tw.WriteHeader(h))
		_, err = io.Copy(tw, tr)
		assert.NilError(t, err)
	}
	assert.NilError(t, tw.WriteHeader(&tar.Header{Name: "marker", Mode: 0o644, Size: int64(len(mark) + 1), Typeflag: tar.TypeReg}))
	_, err = tw.Write([]byte(mark + "\n"))
	assert.NilError(t, err)
	assert.NilError(t, tw.Close())
	assert.NilError(t, dst.Close())
	podmanCLI(t, "import", "--change", `CMD ["/bin/sh"]`, "--quiet", path, m.name)
	id := podmanCLI(t, "image", "inspect", "--format", "{{.ID}}", m.name)
	m.ids = append(m.ids, id)
	return id
}

// provTurn is what the provenance tests read of a turn.
type provTurn struct {
	out      string
	cage     string
	prepared bool
	skipped  string
	imageID  string
}

func provRun(t *testing.T, e *itest.Env, task, script string) provTurn {
	t.Helper()
	code, stdout, stderr := e.Shrooms("--json", "run", "--task", task, "--agent", "pv", "--no-stdin", "--", "-c", script)
	assert.Equal(t, code, 0, "%s %s", stdout, stderr)
	m := lastObject(t, stdout)
	r := provTurn{out: stdout, cage: m["cage"].(string), prepared: m["prepared"].(bool)}
	r.skipped, _ = m["prepared_skipped"].(string)
	if img, ok := m["image"].(map[string]any); ok {
		r.imageID, _ = img["id"].(string)
	}
	return r
}

func provPrepare(t *testing.T, e *itest.Env, task string) string {
	t.Helper()
	code, stdout, stderr := e.Shrooms("prepare", "--task", task, "--agent", "pv", "--no-stdin")
	assert.Equal(t, code, 0, stderr)
	id := strings.TrimSpace(stdout)
	assert.Equal(t, len(id), 64, stdout)
	return id
}

// cageImage is the id of the image podman created cage id from.
func cageImage(t *testing.T, id string) string {
	return podmanCLI(t, "container", "inspect", "--format", "{{.Image}}", id)
}

func cageGone(t *testing.T, id string) bool {
	return exec.Command("podman", "--url", itest.Socket(), "container", "exists", id).Run() != nil
}

// provEnv is a config whose agent pv runs /bin/sh from image, with token k
// in $TOK and seccomp (when set) as its profile.
func provEnv(t *testing.T, image, profile string) (*itest.Env, string) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	assert.NilError(t, os.WriteFile(token, []byte("token-one"), 0o600))
	e, _ := integration(t, "[tokens]\nk = \""+token+"\"\n[agents.pv]\ncommand = [\"/bin/sh\"]\nhome = [\"shell\"]\nimage = \""+image+"\"\ntoken_env = { TOK = \"k\" }\n")
	if profile != "" {
		cfg, err := os.ReadFile(e.Config)
		assert.NilError(t, err)
		cfg = []byte(strings.Replace(string(cfg), `memory = "256m"`, "memory = \"256m\"\nseccomp = \""+profile+"\"", 1))
		assert.NilError(t, os.WriteFile(e.Config, cfg, 0o600))
	}
	return e, token
}

// TestPreparedCageRunsTheImageOfNow: a prepared cage is created from the
// image its name points at then. The owner imports a new image under the
// same name: the next turn runs the new image (its /marker), in a fresh
// cage; the prepared one, created from the old image (the control: taken,
// it would run the old one), is discarded; run --json's image.id is the
// image that ran.
func TestPreparedCageRunsTheImageOfNow(t *testing.T) {
	requireStatic(t)
	imgs := newMarkedImages(t)
	idA := imgs.build("image-A")
	e, _ := provEnv(t, imgs.name, "")
	task := e.Task("img")

	// Positive control: a prepared cage that matches is taken, and runs
	// the image it was created from.
	p1 := provPrepare(t, e, task)
	r := provRun(t, e, task, "cat /marker")
	assert.Assert(t, r.prepared && r.cage == p1, "an unchanged prepared cage is taken")
	assert.Assert(t, is.Contains(r.out, "image-A"))
	assert.Equal(t, r.imageID, idA)

	p2 := provPrepare(t, e, task)
	assert.Equal(t, cageImage(t, p2), idA)
	idB := imgs.build("image-B")
	assert.Assert(t, idB != idA)
	assert.Equal(t, cageImage(t, p2), idA, "the prepared cage still holds the old image: taken, it would run image-A")

	r = provRun(t, e, task, "cat /marker")
	assert.Assert(t, !r.prepared, "the prepared cage of the old image was taken")
	assert.Equal(t, r.skipped, turn.SkipProvenance)
	assert.Assert(t, r.cage != p2)
	assert.Assert(t, cageGone(t, p2), "the discarded prepared cage %s was left", p2)
	assert.Assert(t, is.Contains(r.out, "image-B"))
	assert.Assert(t, !strings.Contains(r.out, "image-A"))
	assert.Equal(t, r.imageID, idB, "run --json names the image that ran")
}

// TestPreparedCageRunsTheSeccompProfileOfNow: the custom seccomp file is
// read when a cage is created. The owner edits it (mkdir is no longer
// allowed): the next turn runs under the new profile, in a fresh cage.
func TestPreparedCageRunsTheSeccompProfileOfNow(t *testing.T) {
	requireStatic(t)
	profile := filepath.Join(t.TempDir(), "seccomp.json")
	assert.NilError(t, os.WriteFile(profile, seccomp.Profile(), 0o644))
	e, _ := provEnv(t, itest.TestImage, profile)
	task := e.Task("sec")
	const probe = `mkdir /tmp/d 2>/dev/null && echo mkdir-allowed || echo mkdir-refused`

	p1 := provPrepare(t, e, task)
	r := provRun(t, e, task, probe)
	assert.Assert(t, r.prepared && r.cage == p1, "an unchanged prepared cage is taken")
	assert.Assert(t, is.Contains(r.out, "mkdir-allowed"), "positive control: the first profile allows mkdir")

	p2 := provPrepare(t, e, task)
	assert.NilError(t, os.WriteFile(profile, withoutSyscalls(t, seccomp.Profile(), "mkdir", "mkdirat"), 0o644))
	r = provRun(t, e, task, probe)
	assert.Assert(t, !r.prepared, "the prepared cage of the old profile was taken")
	assert.Equal(t, r.skipped, turn.SkipProvenance)
	assert.Assert(t, r.cage != p2)
	assert.Assert(t, cageGone(t, p2), "the discarded prepared cage %s was left", p2)
	assert.Assert(t, is.Contains(r.out, "mkdir-refused"), "the turn ran under the old profile: %s", r.out)

	// And the new profile's cage, prepared and unchanged, is taken again.
	p3 := provPrepare(t, e, task)
	r = provRun(t, e, task, probe)
	assert.Assert(t, r.prepared && r.cage == p3)
	assert.Assert(t, is.Contains(r.out, "mkdir-refused"))
}

// withoutSyscalls is the profile with names taken out of its allow rules
// (its default action refuses them then).
func withoutSyscalls(t *testing.T, profile []byte, names ...string) []byte {
	var p map[string]any
	assert.NilError(t, json.Unmarshal(profile, &p))
	removed := 0
	for _, s := range p["syscalls"].([]any) {
		rule := s.(map[string]any)
		var keep []any
		for _, n := range rule["names"].([]any) {
			if slices.Contains(names, n.(string)) {
				removed++
				continue
			}
			keep = append(keep, n)
		}
		rule["names"] = keep
	}
	assert.Assert(t, removed > 0)
	b, err := json.Marshal(p)
	assert.NilError(t, err)
	return b
}

// TestPreparedCageGetsTheTokenOfNow: a token file is put in a podman secret
// when the cage is created. The owner rotates it: the next turn gets the
// new token, in a fresh cage. The label holds a keyed digest, never the
// token or a plain hash of it.
func TestPreparedCageGetsTheTokenOfNow(t *testing.T) {
	requireStatic(t)
	e, token := provEnv(t, itest.TestImage, "")
	task := e.Task("tok")

	p1 := provPrepare(t, e, task)
	labels := podmanCLI(t, "container", "inspect", "--format", "{{json .Config.Labels}}", p1)
	assert.Assert(t, !strings.Contains(labels, "token-one"), labels)
	assert.Assert(t, is.Contains(labels, `"io.shrooms.tokens":"hmac-sha256:`), labels)
	r := provRun(t, e, task, `echo "tok=$TOK"`)
	assert.Assert(t, r.prepared && r.cage == p1, "an unchanged prepared cage is taken")
	assert.Assert(t, is.Contains(r.out, "tok=token-one"), "positive control: the cage reads the token")

	p2 := provPrepare(t, e, task)
	assert.NilError(t, os.WriteFile(token, []byte("token-two"), 0o600))
	r = provRun(t, e, task, `echo "tok=$TOK"`)
	assert.Assert(t, !r.prepared, "the prepared cage of the old token was taken")
	assert.Equal(t, r.skipped, turn.SkipProvenance)
	assert.Assert(t, r.cage != p2)
	assert.Assert(t, cageGone(t, p2), "the discarded prepared cage %s was left", p2)
	assert.Assert(t, is.Contains(r.out, "tok=token-two"), r.out)

	// The digest key is the task's own, in the state dir, owner-only.
	fi, err := os.Stat(filepath.Join(e.Dir, "state", "tasks", task, "prepared-token-key"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o600))
	assert.Equal(t, fi.Size(), int64(32))
}
