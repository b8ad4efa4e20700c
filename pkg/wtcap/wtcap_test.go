package wtcap

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// kernelQuota reports whether the running kernel can enforce ext4 project
// quotas (CONFIG_QUOTA and CONFIG_QFMT_V2), from /proc/config.gz.
func kernelQuota(t *testing.T) bool {
	out, err := exec.Command("sh", "-c", "zcat /proc/config.gz 2>/dev/null | grep -E '^CONFIG_(QUOTA|QFMT_V2)=y' | wc -l").Output()
	if err != nil || strings.TrimSpace(string(out)) == "0" {
		return true // no config to read: assume it can, and let the mount say
	}
	return strings.TrimSpace(string(out)) == "2"
}

// quotaFS makes an ext4 image, mounts it (with prjquota when quota) and
// returns the mount point (unmounted in Cleanup).
func quotaFS(t *testing.T, size string, quota bool) string {
	t.Helper()
	itest.Require(t, itest.Root)
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	assert.NilError(t, os.Mkdir(mnt, 0o755))
	mkfs := []string{"mkfs.ext4", "-q", img}
	opts := "loop"
	if quota {
		mkfs = []string{"mkfs.ext4", "-q", "-O", "quota,project", "-E", "quotatype=prjquota", img}
		opts = "loop,prjquota"
	}
	for _, c := range [][]string{{"truncate", "-s", size, img}, mkfs, {"mount", "-o", opts, img, mnt}} {
		out, err := exec.Command(c[0], c[1:]...).CombinedOutput()
		assert.NilError(t, err, "%v: %s", c, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt
}

// asNobody runs a shell script as uid/gid 65534 without capabilities (a
// cage user: CAP_SYS_RESOURCE would let root exceed the quota).
func asNobody(script string) (string, error) {
	out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "sh", "-c", script).CombinedOutput()
	return string(out), err
}

// quotaKernel says whether this kernel enforces project quotas; when it
// does not (Firecracker CI kernels lack CONFIG_QFMT_V2) it checks the
// kernel's word — a prjquota mount of a quota-formatted image must fail,
// else the detection is wrong and the test fails — and says loudly that
// the test's enforcement part is not exercised here. What shrooms does on
// such a kernel is refuse, which TestNoQuotaIsRefusedWithTheReason checks.
func quotaKernel(t *testing.T) bool {
	t.Helper()
	if kernelQuota(t) {
		return true
	}
	itest.Require(t, itest.Root)
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	assert.NilError(t, os.Mkdir(mnt, 0o755))
	for _, c := range [][]string{{"truncate", "-s", "64M", img}, {"mkfs.ext4", "-q", "-O", "quota,project", "-E", "quotatype=prjquota", img}} {
		out, err := exec.Command(c[0], c[1:]...).CombinedOutput()
		assert.NilError(t, err, "%v: %s", c, out)
	}
	out, err := exec.Command("mount", "-o", "loop,prjquota", img, mnt).CombinedOutput()
	if err == nil {
		_ = exec.Command("umount", mnt).Run()
		t.Fatalf("the kernel config says no quota support, yet a prjquota mount worked: fix kernelQuota")
	}
	t.Logf("KERNEL WITHOUT QUOTA SUPPORT (CONFIG_QFMT_V2; prjquota mount refused: %s): project ids and ENOSPC not exercised here; the refusal is TestNoQuotaIsRefusedWithTheReason", strings.TrimSpace(string(out)))
	return false
}

func TestProjectQuotaCapsTheWorktree(t *testing.T) {
	if !quotaKernel(t) {
		return
	}
	mnt := quotaFS(t, "96M", true)
	s, err := Probe(mnt)
	assert.NilError(t, err)
	assert.Assert(t, s.OK, s.Reason)
	assert.Equal(t, s.FSType, "ext4")

	wt, other := filepath.Join(mnt, "wt"), filepath.Join(mnt, "other")
	for _, d := range []string{wt, filepath.Join(wt, "sub"), other} {
		assert.NilError(t, os.Mkdir(d, 0o777))
		assert.NilError(t, os.Chmod(d, 0o777))
	}
	// A file that exists before the cap is capped too when it grows.
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "sub", "old"), []byte("x"), 0o666))
	assert.NilError(t, os.Chmod(filepath.Join(wt, "sub", "old"), 0o666))
	assert.NilError(t, os.Symlink("/etc/passwd", filepath.Join(wt, "link")))

	assert.NilError(t, Apply(s, wt, 4242, 8<<20, 50))

	out, err := asNobody("dd if=/dev/zero of=" + filepath.Join(wt, "sub", "big") + " bs=1M count=32")
	assert.Assert(t, err != nil && strings.Contains(out, "No space left on device"), "a write past max_size: %v %s", err, out)
	b, files, err := Usage(s, 4242)
	assert.NilError(t, err)
	assert.Assert(t, b <= 8<<20+64<<10, "usage %d over the cap", b)
	out, err = asNobody("dd if=/dev/zero of=" + filepath.Join(wt, "sub", "old") + " bs=1M count=32 oflag=append conv=notrunc")
	assert.Assert(t, err != nil && strings.Contains(out, "No space left on device"), "an old file grown past max_size: %v %s", err, out)
	assert.NilError(t, os.Remove(filepath.Join(wt, "sub", "big")))
	assert.NilError(t, os.Truncate(filepath.Join(wt, "sub", "old"), 0))
	out, err = asNobody("i=0; while [ $i -lt 100 ]; do : > " + wt + "/f$i || exit 1; i=$((i+1)); done")
	assert.Assert(t, err != nil && strings.Contains(out, "No space left on device"), "files past max_files: %v %s (files %d)", err, out, files)

	// Positive control: the same writes outside the project succeed, so the
	// filesystem itself had room (another task's HOME would keep working).
	out, err = asNobody("dd if=/dev/zero of=" + filepath.Join(other, "big") + " bs=1M count=32 && i=0; while [ $i -lt 100 ]; do : > " + other + "/f$i || exit 1; i=$((i+1)); done")
	assert.NilError(t, err, out)
	// The link was not followed.
	fi, err := os.Lstat(filepath.Join(wt, "link"))
	assert.NilError(t, err)
	assert.Assert(t, fi.Mode()&os.ModeSymlink != 0)
}

func TestProbeSaysWhyNot(t *testing.T) {
	itest.Require(t, itest.Root)
	s, err := Probe("/proc")
	assert.NilError(t, err)
	assert.Assert(t, !s.OK)
	assert.Assert(t, strings.Contains(s.Reason, "proc"), s.Reason)
	err = Apply(s, "/proc", 1, 1, 1)
	assert.ErrorContains(t, err, "no project quota")
}

// TestNoQuotaIsRefusedWithTheReason: an ext4 worktree mounted without
// prjquota (the test's own image) cannot be capped: Probe says why, and
// Apply refuses rather than run uncapped.
func TestNoQuotaIsRefusedWithTheReason(t *testing.T) {
	mnt := quotaFS(t, "32M", false)
	s, err := Probe(mnt)
	assert.NilError(t, err)
	assert.Assert(t, !s.OK)
	assert.Equal(t, s.FSType, "ext4")
	assert.Assert(t, strings.Contains(s.Reason, "not mounted with prjquota"), s.Reason)
	assert.ErrorContains(t, Apply(s, mnt, 7, 1<<20, 16), "prjquota")
}

// TestApplyLeavesEntriesAlreadyInTheProject: a turn's Apply on a worktree
// already in its project sets nothing, so no entry's ctime moves (a moved
// ctime would send every directory to a new listing by the guard's and the
// change scan's caches, every turn). The control: the first Apply of a
// tree moves the ctimes the probe reads.
func TestApplyLeavesEntriesAlreadyInTheProject(t *testing.T) {
	if !quotaKernel(t) {
		return
	}
	mnt := quotaFS(t, "64M", true)
	s, err := Probe(mnt)
	assert.NilError(t, err)
	assert.Assert(t, s.OK, s.Reason)
	wt := filepath.Join(mnt, "wt")
	for _, p := range []string{"a/b", "c"} {
		assert.NilError(t, os.MkdirAll(filepath.Join(wt, p), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(wt, p, "f"), []byte("x"), 0o644))
	}
	ctimes := func() map[string]unix.Timespec {
		m := map[string]unix.Timespec{}
		assert.NilError(t, filepath.WalkDir(wt, func(p string, _ os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			m[p] = st.Ctim
			return nil
		}))
		return m
	}
	before := ctimes()
	time.Sleep(20 * time.Millisecond) // past a tick of the clock ctimes come from
	assert.NilError(t, Apply(s, wt, 4343, 8<<20, 100))
	first := ctimes()
	for p, c := range first {
		assert.Assert(t, c != before[p], "control: the first Apply left %s's ctime", p)
	}
	time.Sleep(20 * time.Millisecond)
	assert.NilError(t, Apply(s, wt, 4343, 8<<20, 100))
	assert.DeepEqual(t, ctimes(), first)
}
