package turn

import (
	"bytes"
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/containers/podman/v5/pkg/specgen"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testbed"
	"github.com/shrooms-cage/shrooms/internal/testcfg"
	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// BenchmarkNetworkedTurnVsBarePodman is BenchmarkTurnVsBarePodman with the
// cage on the sealed bridge network (policy internet), in the testbed's host
// namespace: shrooms' turn includes the seal verification and the bridge
// checks; the bare sequences use the same network without them (`make bench`).
func BenchmarkNetworkedTurnVsBarePodman(b *testing.B) {
	itest.Require(b, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	tb := testbed.New(b)
	tb.StartPodman()
	// Made after the testbed, so that its cleanup runs before the testbed's.
	world := itest.New(b, "bn", itest.WithSocket(tb.PodmanURL))
	name := world.Prefix
	sub4, sub6 := itest.Subnets(b)
	cfg := testcfg.Config{
		Cage: map[string]any{"pids": 128, "nofile": 512, "nproc": 256, "timeout": nil, "stop_grace": nil},
		// driver podman: the bare runs below join the same podman network.
		Network: map[string]any{"policy": "internet", "driver": "podman", "name": name, "bridge": name,
			"subnet4": sub4, "subnet6": sub6, "dns_upstream": []string{testbed.InternetAddr4.String()}}}.For(world).Parse(b, "bench.toml")
	ctx := context.Background()
	opts := firewall.Options{NetNS: tb.NSPath("host")}
	if err := firewall.Apply(ctx, cfg.Network, opts); err != nil {
		b.Fatal(err)
	}
	client, err := podman.Connect(ctx, tb.PodmanURL)
	if err != nil {
		b.Fatal(err)
	}
	r := NewRunner(cfg, client, func(ctx context.Context, cfg *config.Config, dry bool) (SealState, error) {
		return cagenet.CheckSeal(ctx, cfg, client, opts, dry)
	})
	r.Resolver = cagenet.Resolver(opts, tb.DialContext("host"))
	task := name + "-t"
	world.Release = testcfg.Release(cfg, client)
	world.Finally(func() {
		_, _ = tb.Podman("network", "rm", "-f", name)
		_ = firewall.Flush(context.Background(), cfg.Network, opts)
	})
	req := Request{Task: taskid.Must(task), Agent: "shell", Args: []string{"-c", "true"}, Streams: podman.Streams{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}}
	if _, err := r.Run(ctx, req); err != nil {
		b.Fatal(err)
	}
	var spec *specgen.SpecGenerator
	r.OnSpec = func(s *specgen.SpecGenerator) { spec = s }

	var shrooms, api, cli []time.Duration
	for i := 0; i < max(b.N, 10); i++ {
		start := time.Now()
		if _, err := r.Run(ctx, req); err != nil {
			b.Fatal(err)
		}
		shrooms = append(shrooms, time.Since(start))

		s := bareSpec(b, spec, "bench-net-")
		start = time.Now()
		id, err := client.Create(ctx, s)
		if err != nil {
			b.Fatal(err)
		}
		done, err := client.Start(ctx, id, podman.Streams{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := client.Wait(ctx, id); err != nil {
			b.Fatal(err)
		}
		<-done
		if err := client.Remove(ctx, id); err != nil {
			b.Fatal(err)
		}
		api = append(api, time.Since(start))

		start = time.Now()
		out, err := exec.Command("podman", "--url", tb.PodmanURL, "run", "--rm", "--network", name,
			"--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges", "--user", "1000:1000",
			"--memory", "256m", "--pids-limit", "128", "--ulimit", "nofile=512:512", "--ulimit", "nproc=256:256",
			itest.TestImage, "/bin/sh", "-c", "true").CombinedOutput()
		if err != nil {
			b.Fatalf("podman run: %v: %s", err, out)
		}
		cli = append(cli, time.Since(start))
	}
	ms := func(d []time.Duration) float64 { return float64(median(d).Microseconds()) / 1000 }
	b.ReportMetric(ms(shrooms), "shrooms-ms")
	b.ReportMetric(ms(api), "bare-api-ms")
	b.ReportMetric(ms(cli), "podman-run-cli-ms")
	b.ReportMetric(ms(shrooms)/ms(api), "ratio-vs-api")
	b.ReportMetric(ms(shrooms)/ms(cli), "ratio-vs-cli")
	b.ReportMetric(0, "ns/op")
}
