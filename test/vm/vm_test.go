//go:build vmtest

// Package vm is `make vm-test`: shrooms installed with `make install` on a
// booted Debian 12 VM (systemd running), checked after a reboot, with the
// seal unit made to fail for a negative control, then uninstalled. The VM
// image is built from Debian packages (image.sh, cached by its inputs); the
// repository's build comes in on a second, read-only disk; the guest side
// (guest.sh) reports on the second serial port. The VM has no network
// device.
package vm

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// need fails (SHROOMS_REQUIRE_INTEGRATION=1) or skips without a prerequisite.
func need(t *testing.T, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("SHROOMS_REQUIRE_INTEGRATION") == "1" {
		t.Fatalf("vm-test needs %s", what)
	}
	t.Skipf("vm-test needs %s", what)
}

func have(tool string) bool { _, err := exec.LookPath(tool); return err == nil }

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func run(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// dataDisk builds the second disk: guest.sh, the scripted model API and
// what `make install` reads of the repository (bin/shrooms already built).
func dataDisk(t *testing.T, root, dir string) string {
	t.Helper()
	data := filepath.Join(dir, "data")
	src := filepath.Join(data, "src")
	for _, d := range []string{"bin", "dist", "scripts"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(root, "bin", "shrooms")
	need(t, fileExists(bin), "bin/shrooms (make build)")
	// cp -p keeps the mtimes, so make sees bin/shrooms newer than go.mod
	// and builds nothing in the VM (which has no Go).
	run(t, root, "cp", "-p", "Makefile", "config.example.toml", "go.mod", "go.sum", src)
	run(t, root, "cp", "-p", "-r", "dist", src)
	run(t, root, "cp", "-p", "scripts/build-test-image.sh", filepath.Join(src, "scripts"))
	run(t, root, "cp", "-p", bin, filepath.Join(src, "bin"))
	run(t, root, "touch", filepath.Join(src, "bin", "shrooms"))
	run(t, root, "cp", "test/vm/guest.sh", data)
	env := append(os.Environ(), "CGO_ENABLED=0")
	cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(data, "vm-modelapi"), "./test/vm/modelapi")
	cmd.Dir, cmd.Env = root, env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the scripted model API: %v\n%s", err, out)
	}
	img := filepath.Join(dir, "data.img")
	run(t, dir, "mkfs.ext4", "-q", "-F", "-L", "vmdata", "-d", data, img, "256M")
	return img
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// phase is one stretch of the VM's run, ended by a line of results.log
// starting with marker, bounded by its own timeout.
type phase struct {
	marker  string
	timeout time.Duration
}

func TestInstalledHostBoots(t *testing.T) {
	need(t, os.Geteuid() == 0, "root")
	for _, tool := range []string{"qemu-system-x86_64", "mmdebstrap", "mkfs.ext4"} {
		need(t, have(tool), tool+" (make vm-test installs it)")
	}
	root := repoRoot(t)
	cache := os.Getenv("SHROOMS_VM_CACHE")
	if cache == "" {
		cache = "/var/cache/shrooms-vm"
	}
	start := time.Now()
	image := strings.TrimSpace(lastLine(run(t, root, "bash", "test/vm/image.sh", cache)))
	t.Logf("image %s ready after %s", image, time.Since(start).Round(time.Second))
	dir := t.TempDir()
	data := dataDisk(t, root, dir)
	console, results := filepath.Join(dir, "console.log"), filepath.Join(dir, "results.log")

	ctx, cancel := context.WithTimeout(context.Background(), 75*time.Minute)
	defer cancel()
	accel := bootingAccel(t, image, dir)
	qemu := exec.CommandContext(ctx, "qemu-system-x86_64",
		"-machine", "q35,accel="+accel, "-cpu", "max", "-smp", "2", "-m", "2048",
		"-display", "none", "-nodefaults", "-no-user-config", "-nic", "none",
		"-kernel", filepath.Join(image, "vmlinuz"), "-initrd", filepath.Join(image, "initrd.img"),
		// panic=0: a panicking guest hangs until its phase times out
		// instead of rebooting in a loop.
		"-append", "root=/dev/vda rw console=ttyS0 panic=0 quiet systemd.show_status=false",
		// snapshot=on: the cached image is never written; the guest's
		// writes live until qemu exits, across its reboots.
		"-drive", "file="+filepath.Join(image, "root.img")+",format=raw,if=virtio,snapshot=on",
		"-drive", "file="+data+",format=raw,if=virtio,readonly=on",
		"-serial", "file:"+console, "-serial", "file:"+results)
	if err := qemu.Start(); err != nil {
		t.Fatalf("starting qemu: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- qemu.Wait() }()
	gone := false
	defer func() {
		if !gone {
			_ = qemu.Process.Kill() // by its pid, never by name
			<-exited
		}
	}()
	t.Logf("qemu pid %d, accel %s", qemu.Process.Pid, accel)

	phases := []phase{
		{"VMTEST phase 1", 20 * time.Minute},  // first boot under TCG on a loaded host
		{"VMTEST reboot 1", 15 * time.Minute}, // make install, the test image
		{"VMTEST phase 2", 20 * time.Minute},
		{"VMTEST reboot 2", 15 * time.Minute}, // turns, gateway, forget
		{"VMTEST phase 3", 20 * time.Minute},
		{"VMTEST done", 10 * time.Minute}, // negative control, uninstall
	}
	bootStart := time.Now()
	for _, p := range phases {
		begin := time.Now()
		deadline := time.After(p.timeout)
	wait:
		for {
			if strings.Contains(readFile(results), p.marker) {
				t.Logf("%q after %s (phase %s)", p.marker, time.Since(bootStart).Round(time.Second), time.Since(begin).Round(time.Second))
				break wait
			}
			select {
			case err := <-exited:
				gone = true
				t.Fatalf("qemu exited (%v) before %q\nresults:\n%s\nconsole tail:\n%s", err, p.marker, readFile(results), tail(readFile(console), 60))
			case <-deadline:
				t.Fatalf("no %q within %s: the VM is killed\nresults:\n%s\nconsole tail:\n%s", p.marker, p.timeout, readFile(results), tail(readFile(console), 60))
			case <-ctx.Done():
				t.Fatalf("the whole test's bound passed before %q", p.marker)
			case <-time.After(2 * time.Second):
			}
		}
	}
	select {
	case <-exited:
		gone = true
	case <-time.After(5 * time.Minute):
		t.Errorf("the VM did not power off within 5 minutes of its last check")
	}
	t.Logf("VM run %s, whole test %s", time.Since(bootStart).Round(time.Second), time.Since(start).Round(time.Second))
	if out := os.Getenv("SHROOMS_VM_RESULTS"); out != "" {
		_ = os.WriteFile(out, []byte(readFile(results)), 0o644)
	}
	check(t, parse(readFile(results)))
}

// results maps a key to its values, in order ("VMTEST key value" lines;
// "key| line" for multi-line output).
type results map[string][]string

func parse(s string) results {
	r := results{}
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(strings.TrimRight(sc.Text(), "\r"), "VMTEST ")
		if !ok {
			continue
		}
		if k, v, ok := strings.Cut(line, "| "); ok && !strings.Contains(k, " ") {
			r[k] = append(r[k], v)
			continue
		}
		k, v, _ := strings.Cut(line, " ")
		r[k] = append(r[k], v)
	}
	return r
}

func (r results) text(k string) string { return strings.Join(r[k], "\n") }

// unit returns the n-th (0-based) report of unit u's properties.
func (r results) unit(u string, n int) map[string]string {
	props := map[string]string{}
	i := 0
	for _, v := range r["unit"] {
		name, rest, _ := strings.Cut(v, " ")
		if name != u {
			continue
		}
		if i == n {
			for _, f := range strings.Fields(rest) {
				k, val, _ := strings.Cut(f, "=")
				props[k] = val
			}
			return props
		}
		i++
	}
	return props
}

func atoi(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }

func check(t *testing.T, r results) {
	t.Helper()
	want := func(cond bool, format string, args ...any) {
		t.Helper()
		if !cond {
			t.Errorf(format, args...)
		}
	}
	want(r.text("install_rc") == "0", "make install failed (rc %s):\n%s", r.text("install_rc"), r.text("install"))
	want(strings.Contains(r.text("install"), "systemctl enable --now podman.socket shrooms-seal.service"),
		"make install did not enable the units on the running systemd:\n%s", r.text("install"))

	// Boot 2: the seal is active before podman's socket listens.
	seal, sock := r.unit("shrooms-seal.service", 0), r.unit("podman.socket", 0)
	want(seal["ActiveState"] == "active", "after the reboot shrooms-seal.service is %q, want active", seal["ActiveState"])
	want(sock["ActiveState"] == "active", "after the reboot podman.socket is %q, want active", sock["ActiveState"])
	sealUp, sockStart := atoi(seal["ActiveEnterTimestampMonotonic"]), atoi(sock["InactiveExitTimestampMonotonic"])
	want(sealUp > 0 && sockStart > 0 && sealUp <= sockStart,
		"shrooms-seal active at %d µs, podman.socket began to listen at %d µs: the seal must come first", sealUp, sockStart)
	t.Logf("boot ordering: seal active at %.3f s, podman.socket started at %.3f s (monotonic)", float64(sealUp)/1e6, float64(sockStart)/1e6)
	j := r.text("journal")
	sealLine, sockLine := lineIndex(j, "shrooms-seal"), lineIndex(j, "Listening on podman.socket")
	want(sealLine >= 0 && sockLine > sealLine, "the journal does not show the seal before podman.socket listens:\n%s", j)

	want(r.text("netstatus_rc") == "0", "shrooms net status failed (rc %s):\n%s", r.text("netstatus_rc"), r.text("netstatus"))
	want(!strings.Contains(r.text("secrets"), "anthropic"), "the VM has /run/secrets/anthropic-api-key; the point is a turn without it: %s", r.text("secrets"))

	// The shell turns: planted in turn 1 (positive control), gone in turn 2.
	want(r.text("turn1_rc") == "0" && regexp.MustCompile(`PLANTED=[1-9]`).MatchString(r.text("turn1")),
		"turn 1 of the shell agent (no token file) did not run and plant its hook (rc %s):\n%s", r.text("turn1_rc"), r.text("turn1"))
	t2 := r.text("turn2")
	want(r.text("turn2_rc") == "0", "turn 2 failed (rc %s):\n%s", r.text("turn2_rc"), t2)
	for _, s := range []string{"HOOK=gone", "RC=gone", "PWNED=no"} {
		want(strings.Contains(t2, s), "turn 2 lacks %s: what turn 1 planted survived:\n%s", s, t2)
	}

	// The gateway turn: a placeholder in the cage, the real key upstream.
	gw := r.text("gwturn")
	want(r.text("gwturn_rc") == "0", "the gateway turn failed (rc %s):\n%s", r.text("gwturn_rc"), gw)
	want(strings.Contains(gw, "REALKEY_IN_ENV=0"), "the real key is in the cage's environment, or the check did not run:\n%s", gw)
	want(strings.Contains(gw, `"text":"ok"`), "the cage got no answer of the scripted API through the gateway:\n%s", gw)
	want(strings.Contains(r.text("modelapi"), "request POST /v1/messages realkey=true"),
		"the scripted API did not get the request with the real key:\n%s", r.text("modelapi"))

	// forget and gc leave nothing.
	for _, k := range []string{"left_volumes", "left_loops", "left_mounts", "left_state"} {
		want(r.text(k) == "0", "after forget and gc, %s = %q, want 0", k, r.text(k))
	}
	want(strings.TrimSpace(r.text("left_containers")) == "", "after forget and gc, containers are left: %s", r.text("left_containers"))

	// Boot 3, negative control: the seal unit fails, so nothing networked starts.
	seal3 := r.unit("shrooms-seal.service", 1)
	want(seal3["ActiveState"] == "failed", "with the failing drop-in shrooms-seal.service is %q, want failed", seal3["ActiveState"])
	want(r.text("netstatus_failed_rc") != "0", "shrooms net status passed without the seal:\n%s", r.text("netstatus_failed"))
	want(r.text("failturn_rc") == "122", "a turn without the seal exited %s, want 122 (refused):\n%s", r.text("failturn_rc"), r.text("failturn"))
	want(!strings.Contains(r.text("failturn"), "CAGE-RAN"), "the cage ran without the seal:\n%s", r.text("failturn"))

	// make uninstall leaves nothing of shrooms' but the owner's config.
	want(r.text("uninstall_rc") == "0", "make uninstall failed (rc %s):\n%s", r.text("uninstall_rc"), r.text("uninstall"))
	// Kept by design: the owner's config (and the test's key beside it).
	// Podman's own: the lock files any podman network call makes, and the
	// directory they are in (shrooms' network file in it must be gone).
	kept := map[string]bool{"/etc/shrooms": true, "/etc/shrooms/config.toml": true, "/etc/shrooms/vm-api-key": true, "/srv/work": true,
		"/etc/containers/networks": true, "/etc/containers/networks/netavark.lock": true, "/etc/cni/net.d/cni.lock": true}
	var left []string
	for _, f := range r["leftover"] {
		if !kept[f] {
			left = append(left, f)
		}
	}
	want(strings.Contains(r.text("uninstall"), "purge"), "make uninstall PURGE=1 did not run shrooms purge:\n%s", r.text("uninstall"))
	want(len(left) == 0, "after make uninstall these files are new since before make install:\n%s", strings.Join(left, "\n"))
	if t.Failed() {
		t.Logf("all results:\n%s", fmt.Sprint(r))
	}
}

func lineIndex(s, sub string) int {
	for i, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return i
		}
	}
	return -1
}

func readFile(p string) string { b, _ := os.ReadFile(p); return string(b) }

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// bootingAccel is "kvm" when the image's kernel prints its banner under KVM
// within 20 s, else "tcg". An openable /dev/kvm is not enough: on some
// hosts (a paravirtual KVM) qemu starts under KVM and the guest never runs
// (measured: no console byte in 20 minutes), while qemu's "kvm:tcg" only
// falls back when KVM fails to initialise.
func bootingAccel(t *testing.T, image, dir string) string {
	t.Helper()
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg"
	}
	f.Close()
	console := filepath.Join(dir, "kvm-probe.log")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	probe := exec.CommandContext(ctx, "qemu-system-x86_64",
		"-machine", "q35,accel=kvm", "-cpu", "max", "-m", "512",
		"-display", "none", "-nodefaults", "-no-user-config", "-nic", "none", "-no-reboot",
		"-kernel", filepath.Join(image, "vmlinuz"), "-append", "console=ttyS0 panic=-1",
		"-serial", "file:"+console)
	if err := probe.Start(); err != nil {
		t.Logf("kvm probe: %v: using tcg", err)
		return "tcg"
	}
	exited := make(chan error, 1)
	go func() { exited <- probe.Wait() }()
	defer func() {
		_ = probe.Process.Kill() // by its pid, never by name
		<-exited
	}()
	for {
		if strings.Contains(readFile(console), "Linux version") {
			return "kvm"
		}
		select {
		case <-exited:
			exited <- nil // the deferred kill's wait
			t.Logf("kvm probe: qemu exited before the kernel's banner: using tcg")
			return "tcg"
		case <-ctx.Done():
			t.Logf("kvm probe: no kernel banner under KVM within 20 s: using tcg")
			return "tcg"
		case <-time.After(200 * time.Millisecond):
		}
	}
}
