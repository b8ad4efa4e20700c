package perf

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// BenchmarkProcessStart is the fixed cost of every shrooms command: the
// binary's process start (`shrooms --version`: runtime, init functions,
// flag parsing, exit) against a hello-world Go binary built the same way,
// exec'd alternately in one run; and the sum of init functions' clock as
// GODEBUG=inittrace=1 reports it. SHROOMS_PERF_BINARY measures another
// build. Needs neither root nor podman.
func BenchmarkProcessStart(b *testing.B) {
	bin := os.Getenv("SHROOMS_PERF_BINARY")
	if bin == "" {
		bin = itest.ShroomsBinary(b)
	}
	hello := buildHello(b)
	rounds := 20 * b.N
	var hs, ss []time.Duration
	var inits []float64
	for i := 0; i < rounds; i++ {
		hs = append(hs, timeExec(b, exec.Command(hello)))
		ss = append(ss, timeExec(b, exec.Command(bin, "--version")))
		if i%4 == 0 {
			inits = append(inits, initMs(b, bin))
		}
	}
	h, s := median(hs), median(ss)
	b.ReportMetric(msOf(h), "hello-p50-ms")
	b.ReportMetric(msOf(s), "shrooms-p50-ms")
	b.ReportMetric(msOf(quantile(ss, 0.9)), "shrooms-p90-ms")
	b.ReportMetric(float64(s)/float64(h), "shrooms/hello")
	b.ReportMetric(medianFloat(inits), "init-p50-ms")
	b.Logf("process start, %d rounds interleaved: hello %.1f ms, shrooms --version %.1f ms (p90 %.1f), ratio %.2f; init functions %.1f ms; load %s",
		rounds, msOf(h), msOf(s), msOf(quantile(ss, 0.9)), float64(s)/float64(h), medianFloat(inits), loadAvg())
}

func buildHello(b *testing.B) string {
	dir := b.TempDir()
	src := "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello\") }\n"
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module hello\n\ngo 1.22\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(dir, "hello")
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if o, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build hello: %v: %s", err, o)
	}
	return out
}

func timeExec(b *testing.B, cmd *exec.Cmd) time.Duration {
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("%v: %v: %s", cmd.Args, err, out)
	}
	return time.Since(start)
}

// initMs is the sum of the "@… ms, N ms clock" of every init line.
func initMs(b *testing.B, bin string) float64 {
	cmd := exec.Command(bin, "--version")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		b.Fatalf("inittrace: %v: %s", err, stderr.Bytes())
	}
	total := 0.0
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// init PKG @T ms, C ms clock, …
		if len(f) >= 7 && f[0] == "init" && f[6] == "clock," {
			if v, err := strconv.ParseFloat(f[4], 64); err == nil {
				total += v
			}
		}
	}
	return total
}

func medianFloat(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64{}, v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
