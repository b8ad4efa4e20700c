package kube_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/kube"
)

const gatewayConfig = `
[tokens]
anthropic = "/etc/shrooms/anthropic.key"
[gateway.anthropic]
upstream = "https://api.anthropic.com"
token = "anthropic"
[agents.claude]
command = ["claude", "--dangerously-skip-permissions"]
home = ["claude", "shell"]
gateway = "anthropic"
`

func build(t *testing.T, cfgText string, in kube.Input) (*config.Config, *kube.Objects, []string) {
	t.Helper()
	cfg, err := config.Parse("test.toml", []byte(cfgText))
	assert.NilError(t, err)
	if in.Task == "" {
		in.Task = "t1"
	}
	if in.Agent == "" {
		in.Agent = "claude"
	}
	if in.Turn == 0 {
		in.Turn = 3
	}
	if in.ShroomsImage == "" {
		in.ShroomsImage = "registry.example/shrooms:1"
	}
	objs, err := kube.Build(cfg, in)
	assert.NilError(t, err)
	out, err := objs.YAML()
	assert.NilError(t, err)
	return cfg, objs, strings.Split(string(out), "\n---\n")
}

// strict decodes one YAML document into v, rejecting unknown fields.
func strict(t *testing.T, doc string, v any) {
	t.Helper()
	assert.NilError(t, yaml.UnmarshalStrict([]byte(doc), v), "document:\n%s", doc)
}

func TestPlainObjectsDecodeStrictly(t *testing.T) {
	cfg, _, docs := build(t, "", kube.Input{Plain: true, RuntimeClass: "gvisor", WorktreePVC: "wt-t1", Args: []string{"-p", "hi"}})
	assert.Equal(t, len(docs), 4)
	var cm corev1.ConfigMap
	var pvc corev1.PersistentVolumeClaim
	var np networkingv1.NetworkPolicy
	var pod corev1.Pod
	strict(t, docs[0], &cm)
	strict(t, docs[1], &pvc)
	strict(t, docs[2], &np)
	strict(t, docs[3], &pod)
	assert.Equal(t, cm.Kind, "ConfigMap")
	assert.Equal(t, pvc.Kind, "PersistentVolumeClaim")
	assert.Equal(t, pvc.Name, "shrooms-home-t1")
	assert.DeepEqual(t, pvc.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod})
	assert.Equal(t, np.Kind, "NetworkPolicy")
	assert.Equal(t, pod.Kind, "Pod")
	assert.Equal(t, pod.Name, "shrooms-t1-3")
	checkSealedPodSpec(t, cfg, pod.Spec)
	assert.DeepEqual(t, np.Spec.PodSelector.MatchLabels, map[string]string{kube.LabelTask: "t1", kube.LabelRole: "turn"})
	assert.Equal(t, pod.Labels[kube.LabelTask], "t1")
	assert.Equal(t, pod.Labels[kube.LabelRole], "turn")
	assert.DeepEqual(t, np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress})
	assert.Check(t, is.Len(np.Spec.Ingress, 0))
	assert.Equal(t, *pod.Spec.RuntimeClassName, "gvisor")
	agent := pod.Spec.Containers[0]
	assert.DeepEqual(t, agent.Command, []string{"claude", "--dangerously-skip-permissions", "-p", "hi"})
	assert.Equal(t, volume(t, pod.Spec, "work").PersistentVolumeClaim.ClaimName, "wt-t1")
}

// checkSealedPodSpec asserts the seal of the podman cage, in Kubernetes terms.
func checkSealedPodSpec(t *testing.T, cfg *config.Config, s corev1.PodSpec) {
	t.Helper()
	assert.Equal(t, *s.HostUsers, false)
	assert.Equal(t, *s.AutomountServiceAccountToken, false)
	assert.Equal(t, *s.EnableServiceLinks, false)
	assert.Equal(t, s.HostNetwork || s.HostPID || s.HostIPC, false)
	assert.Equal(t, s.RestartPolicy, corev1.RestartPolicyNever)
	assert.Equal(t, *s.ActiveDeadlineSeconds, int64(cfg.Cage.Timeout.Std().Seconds()))
	assert.Equal(t, s.SecurityContext.SeccompProfile.Type, corev1.SeccompProfileTypeLocalhost)
	assert.Equal(t, *s.SecurityContext.SeccompProfile.LocalhostProfile, kube.SeccompProfile(cfg))
	assert.Check(t, strings.HasPrefix(kube.SeccompProfile(cfg), "shrooms/shrooms-"))

	assert.Equal(t, len(s.Containers), 1)
	a := s.Containers[0]
	sc := a.SecurityContext
	assert.Equal(t, *sc.RunAsUser, cfg.Cage.User)
	assert.Equal(t, *sc.RunAsGroup, cfg.Cage.User)
	assert.Equal(t, *sc.RunAsNonRoot, true)
	assert.Equal(t, *sc.AllowPrivilegeEscalation, false)
	assert.Equal(t, *sc.ReadOnlyRootFilesystem, true)
	assert.Equal(t, *sc.Privileged, false)
	assert.DeepEqual(t, sc.Capabilities.Drop, []corev1.Capability{"ALL"})
	assert.Check(t, is.Len(sc.Capabilities.Add, 0))
	assert.Equal(t, a.Resources.Limits.Memory().Value(), int64(cfg.Cage.Memory))
	assert.Equal(t, a.Resources.Limits.Cpu().MilliValue(), int64(cfg.Cage.CPUs*1000))
	assert.Equal(t, a.Image, cfg.Cage.Image)

	mounts := map[string]corev1.VolumeMount{}
	for _, m := range a.VolumeMounts {
		mounts[m.MountPath] = m
	}
	assert.Equal(t, mounts["/home/agent"].Name, "home")
	assert.Equal(t, mounts["/home/agent"].SubPath, "shrooms/home", "the agent sees home/, never the reset's .shrooms/")
	assert.Equal(t, mounts["/etc/claude-code"].ReadOnly, true)
	for dir, size := range map[string]config.Size{"/tmp": cfg.Cage.TmpSize, "/run": cfg.Cage.RunSize} {
		ed := volume(t, s, mounts[dir].Name).EmptyDir
		assert.Assert(t, ed != nil, dir)
		assert.Equal(t, ed.Medium, corev1.StorageMediumMemory, dir)
		assert.Equal(t, ed.SizeLimit.Value(), int64(size), dir)
	}
	for _, e := range a.Env {
		assert.Check(t, e.ValueFrom == nil, "agent env %s comes from elsewhere", e.Name)
	}
	assert.Equal(t, volume(t, s, "home").PersistentVolumeClaim.ClaimName, cfg.Home.VolumePrefix+"t1")

	// The reset runs first, on the whole claim, as the agent's own uid with
	// no capabilities; the claim is given to that group by the kubelet.
	r := s.InitContainers[0]
	assert.Equal(t, r.Name, "shrooms-reset")
	assert.DeepEqual(t, r.Command, []string{kube.ShroomsPath})
	assert.Check(t, is.Contains(strings.Join(r.Args, " "), "kube reset-home --agent claude --root /shrooms/volume/shrooms --policy /shrooms/policy --uid 1000 --gid 1000"))
	assert.Equal(t, *s.SecurityContext.FSGroup, cfg.Cage.User)
	assert.Equal(t, *s.SecurityContext.FSGroupChangePolicy, corev1.FSGroupChangeOnRootMismatch)
	assert.Equal(t, *s.SecurityContext.RunAsNonRoot, true)
	for _, c := range append(slices.Clone(s.InitContainers), s.Containers...) {
		sc := c.SecurityContext
		assert.Check(t, *sc.RunAsUser != 0, c.Name)
		assert.Check(t, *sc.RunAsNonRoot, c.Name)
		assert.Check(t, !*sc.AllowPrivilegeEscalation, c.Name)
		assert.Check(t, *sc.ReadOnlyRootFilesystem, c.Name)
		assert.DeepEqual(t, sc.Capabilities.Drop, []corev1.Capability{"ALL"})
		assert.Check(t, is.Len(sc.Capabilities.Add, 0), c.Name)
		assert.DeepEqual(t, sc.SeccompProfile, s.SecurityContext.SeccompProfile)
		assert.Equal(t, c.ImagePullPolicy, kube.PullPolicy(c.Image), c.Name)
	}
	assert.Equal(t, *r.SecurityContext.RunAsUser, cfg.Cage.User)
	assert.Equal(t, *r.SecurityContext.RunAsGroup, cfg.Cage.User)
	assert.Equal(t, r.VolumeMounts[0].Name, "home")
	assert.Equal(t, r.VolumeMounts[0].SubPath, "")
}

func TestPullPolicy(t *testing.T) {
	for image, want := range map[string]corev1.PullPolicy{
		"localhost/shrooms-agent:latest":      corev1.PullNever,
		"localhost/shrooms:1":                 corev1.PullNever,
		"registry.example/shrooms:1":          corev1.PullIfNotPresent,
		"registry.example:5000/a/b:v2":        corev1.PullIfNotPresent,
		"registry.example/a@sha256:0123abcd":  corev1.PullIfNotPresent,
		"registry.example/shrooms:latest":     corev1.PullAlways,
		"registry.example:5000/shrooms":       corev1.PullAlways,
		"ghcr.io/shrooms-cage/agent":          corev1.PullAlways,
		"localhost:5000/shrooms-agent:v1":     corev1.PullIfNotPresent,
		"localhost:5000/shrooms-agent:latest": corev1.PullAlways,
	} {
		assert.Equal(t, kube.PullPolicy(image), want, image)
	}
}

func volume(t *testing.T, s corev1.PodSpec, name string) corev1.Volume {
	t.Helper()
	for _, v := range s.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no volume %q", name)
	return corev1.Volume{}
}

func TestSandboxObjectsDecodeStrictly(t *testing.T) {
	cfg, objs, docs := build(t, "", kube.Input{RuntimeClass: "kata"})
	assert.Equal(t, len(docs), 5)
	var tmpl kube.SandboxTemplate
	var sb kube.Sandbox
	var np networkingv1.NetworkPolicy
	strict(t, docs[2], &np)
	strict(t, docs[3], &tmpl)
	strict(t, docs[4], &sb)
	assert.Equal(t, tmpl.APIVersion, "extensions.agents.x-k8s.io/v1beta1")
	assert.Equal(t, tmpl.Kind, "SandboxTemplate")
	assert.Equal(t, sb.APIVersion, "agents.x-k8s.io/v1beta1")
	assert.Equal(t, sb.Kind, "Sandbox")
	assert.Equal(t, sb.Name, "shrooms-t1-3")
	assert.Equal(t, tmpl.Spec.NetworkPolicyManagement, "Managed")
	assert.Equal(t, tmpl.Spec.EnvVarsInjectionPolicy, "Disallowed")
	assert.DeepEqual(t, tmpl.Spec.NetworkPolicy.Egress, np.Spec.Egress)
	checkSealedPodSpec(t, cfg, tmpl.Spec.PodTemplate.Spec)
	checkSealedPodSpec(t, cfg, sb.Spec.PodTemplate.Spec)
	assert.Equal(t, sb.Spec.PodTemplate.ObjectMeta.Labels[kube.LabelRole], "turn", "the task's NetworkPolicy selects the sandbox's pod")
	assert.Equal(t, *sb.Spec.PodTemplate.Spec.RuntimeClassName, "kata")
	assert.Check(t, objs.Pod == nil)

	// The pod template is exactly what --plain runs.
	_, plain, _ := build(t, "", kube.Input{RuntimeClass: "kata", Plain: true})
	assert.DeepEqual(t, sb.Spec.PodTemplate.Spec, plain.Pod.Spec)
}

// A field Kubernetes does not know fails strict decoding: the check above
// can fail.
func TestStrictDecodingRejectsUnknownFields(t *testing.T) {
	var pod corev1.Pod
	err := yaml.UnmarshalStrict([]byte("apiVersion: v1\nkind: Pod\nspec:\n  hostUser: false\n"), &pod)
	assert.ErrorContains(t, err, "unknown field")
	var sb kube.Sandbox
	err = yaml.UnmarshalStrict([]byte("apiVersion: agents.x-k8s.io/v1beta1\nkind: Sandbox\nspec:\n  podTemplat: {}\n"), &sb)
	assert.ErrorContains(t, err, "unknown field")
}

func TestGatewaySidecarHoldsTheCredential(t *testing.T) {
	ph := strings.Repeat("p", 40)
	_, _, docs := build(t, gatewayConfig, kube.Input{Plain: true, Placeholder: ph})
	var pod corev1.Pod
	strict(t, docs[3], &pod)
	assert.Equal(t, len(pod.Spec.InitContainers), 2)
	gw := pod.Spec.InitContainers[1]
	assert.Equal(t, gw.Name, "gateway")
	assert.Equal(t, *gw.RestartPolicy, corev1.ContainerRestartPolicyAlways, "a native sidecar")
	assert.Equal(t, *gw.SecurityContext.RunAsNonRoot, true)
	assert.DeepEqual(t, gw.SecurityContext.Capabilities.Drop, []corev1.Capability{"ALL"})
	assert.Equal(t, volume(t, pod.Spec, "gateway-key").Secret.SecretName, "shrooms-gateway-anthropic")
	assert.DeepEqual(t, gw.VolumeMounts, []corev1.VolumeMount{{Name: "gateway-key", MountPath: kube.GatewayKeyDir, ReadOnly: true}})
	for _, c := range append(pod.Spec.Containers, pod.Spec.InitContainers[0]) {
		for _, m := range c.VolumeMounts {
			assert.Check(t, m.Name != "gateway-key", "%s mounts the credential", c.Name)
		}
	}
	env := map[string]string{}
	for _, e := range pod.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	assert.Equal(t, env["ANTHROPIC_BASE_URL"], "http://127.0.0.1:4180")
	assert.Equal(t, env["ANTHROPIC_API_KEY"], ph)
	assert.Check(t, is.Contains(strings.Join(pod.Spec.InitContainers[0].Args, " "), "--gateway"))
}

// The sidecar shares the pod's network: it reaches public addresses on 443
// (and DNS) even where network.policy is "none".
func TestGatewayUnderPolicyNone(t *testing.T) {
	rules, err := kube.Egress(config.Network{Policy: "none"}, nil, true)
	assert.NilError(t, err)
	assert.Equal(t, len(rules), 2)
	assert.Equal(t, rules[1].Ports[0].Port.IntValue(), 443)
	assert.Check(t, rules[1].Ports[0].EndPort == nil)
}

func TestBuildRefuses(t *testing.T) {
	cfg := config.Default()
	ok := kube.Input{Task: "t1", Agent: "claude", Turn: 1, ShroomsImage: "x"}
	for name, tc := range map[string]struct {
		mod  func(*kube.Input)
		want string
	}{
		"underscore task":    {func(in *kube.Input) { in.Task = "a_b" }, "not a Kubernetes name"},
		"unknown agent":      {func(in *kube.Input) { in.Agent = "nope" }, "unknown agent"},
		"turn 0":             {func(in *kube.Input) { in.Turn = 0 }, "turn 0"},
		"no init image":      {func(in *kube.Input) { in.ShroomsImage = "" }, "--shrooms-image"},
		"bad runtime class":  {func(in *kube.Input) { in.RuntimeClass = "Not_OK" }, "runtime class"},
		"bad namespace":      {func(in *kube.Input) { in.Namespace = "a.b" }, "namespace"},
		"bad worktree claim": {func(in *kube.Input) { in.WorktreePVC = "UPPER" }, "worktree claim"},
		"bad cluster cidr":   {func(in *kube.Input) { in.ClusterCIDRs = []string{"10.1.2.3/8"} }, "cluster CIDR"},
	} {
		t.Run(name, func(t *testing.T) {
			in := ok
			tc.mod(&in)
			_, err := kube.Build(cfg, in)
			assert.ErrorContains(t, err, tc.want)
		})
	}
	_, err := kube.Build(cfg, ok)
	assert.NilError(t, err, "the unmodified input builds")

	tokens, err := config.Parse("t.toml", []byte("[tokens]\nk = \"/k\"\n[agents.claude]\ncommand = [\"claude\"]\nhome = [\"claude\"]\n[agents.claude.token_env]\nANTHROPIC_API_KEY = \"k\"\n"))
	assert.NilError(t, err)
	_, err = kube.Build(tokens, ok)
	assert.ErrorContains(t, err, "use a gateway")
}

func TestEgressInternet(t *testing.T) {
	rules, err := kube.Egress(config.Network{Policy: "internet"}, []string{"100.128.0.0/16", "10.96.0.0/12"}, false)
	assert.NilError(t, err)
	assert.Equal(t, len(rules), 2)
	// DNS: only the cluster's resolver, only port 53.
	dns := rules[0]
	assert.Equal(t, len(dns.To), 1)
	assert.Check(t, dns.To[0].IPBlock == nil)
	assert.Equal(t, dns.To[0].PodSelector.MatchLabels["k8s-app"], "kube-dns")
	assert.Equal(t, dns.To[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"], "kube-system")
	for _, p := range dns.Ports {
		assert.Equal(t, p.Port.IntValue(), 53)
	}
	// Public: every blocked range excepted, the extra cluster range too (the
	// one inside 10/8 is covered already).
	pub := rules[1]
	except4 := pub.To[0].IPBlock.Except
	assert.Equal(t, pub.To[0].IPBlock.CIDR, "0.0.0.0/0")
	assert.Equal(t, pub.To[1].IPBlock.CIDR, "::/0")
	for _, b := range firewall.Blocked4 {
		assert.Check(t, slices.Contains(except4, b), b)
	}
	for _, b := range firewall.Blocked6 {
		if b == "::ffff:0:0/96" {
			// Refused by the API server in an ipBlock; inside ::/3.
			assert.Check(t, !slices.Contains(pub.To[1].IPBlock.Except, b))
			continue
		}
		assert.Check(t, slices.Contains(pub.To[1].IPBlock.Except, b), b)
	}
	// Every CIDR passes the API server's own check (which refused
	// ::ffff:0:0/96 before; found by test/kubeapi).
	for _, peer := range pub.To {
		for _, c := range append([]string{peer.IPBlock.CIDR}, peer.IPBlock.Except...) {
			assert.Check(t, is.Len(validation.IsValidCIDR(field.NewPath("cidr"), c), 0), c)
		}
	}
	assert.Check(t, slices.Contains(except4, "100.128.0.0/16"))
	assert.Check(t, !slices.Contains(except4, "10.96.0.0/12"))
	for _, probe := range []string{"169.254.169.254", "10.96.0.1", "192.168.1.1", "100.100.100.200", "100.128.3.4", "127.0.0.1"} {
		assert.Check(t, !allowedBy(pub.To[0].IPBlock, probe), "%s must be denied", probe)
	}
	assert.Check(t, allowedBy(pub.To[0].IPBlock, "203.0.113.10"), "positive control: a public address is allowed")
	for _, probe := range []string{"fd00:ec2::254", "fe80::1", "::ffff:10.0.0.1"} {
		assert.Check(t, !allowedBy(pub.To[1].IPBlock, probe), "%s must be denied", probe)
	}
	assert.Check(t, allowedBy(pub.To[1].IPBlock, "2606:4700::1111"))

	// Ports: every TCP and UDP port but the DNS-ish ones, each exactly once.
	for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		seen := make([]int, 65536)
		for _, p := range pub.Ports {
			if *p.Protocol != proto {
				continue
			}
			end := int32(p.Port.IntValue())
			if p.EndPort != nil {
				end = *p.EndPort
			}
			for n := int32(p.Port.IntValue()); n <= end; n++ {
				seen[n]++
			}
		}
		for n := 1; n <= 65535; n++ {
			want := 1
			if slices.Contains([]int{53, 137, 138, 853, 5353, 5355}, n) {
				want = 0
			}
			if seen[n] != want {
				t.Errorf("%s port %d is covered %d times, want %d", proto, n, seen[n], want)
			}
		}
	}
}

func allowedBy(b *networkingv1.IPBlock, addr string) bool {
	a := netip.MustParseAddr(addr)
	if !netip.MustParsePrefix(b.CIDR).Contains(a) {
		return false
	}
	for _, e := range b.Except {
		if netip.MustParsePrefix(e).Contains(a) {
			return false
		}
	}
	return true
}

func TestEgressAllowlistAndNone(t *testing.T) {
	rules, err := kube.Egress(config.Network{Policy: "allowlist", Allow: []string{"203.0.113.0/24", "198.51.100.7"}}, nil, false)
	assert.NilError(t, err)
	assert.Equal(t, len(rules), 1, "no DNS at all under the allowlist (as with the seal)")
	assert.Equal(t, rules[0].To[0].IPBlock.CIDR, "203.0.113.0/24")
	assert.Equal(t, rules[0].To[1].IPBlock.CIDR, "198.51.100.7/32")

	_, err = kube.Egress(config.Network{Policy: "allowlist", Allow: []string{"api.example.com"}}, nil, false)
	assert.ErrorContains(t, err, "not host names")
	_, err = kube.Egress(config.Network{Policy: "allowlist", Allow: []string{"::ffff:203.0.113.7"}}, nil, false)
	assert.ErrorContains(t, err, "IPv4-mapped")
	_, err = kube.Egress(config.Network{Policy: "allowlist", Allow: []string{"169.254.169.254"}}, nil, false)
	assert.ErrorContains(t, err, "overlaps")
	_, err = kube.Egress(config.Network{Policy: "allowlist", Allow: []string{"0.0.0.0/0"}}, nil, false)
	assert.ErrorContains(t, err, "overlaps")
	_, err = kube.Egress(config.Network{Policy: "allowlist", Allow: []string{"100.128.0.0/24"}}, []string{"100.128.0.0/16"}, false)
	assert.ErrorContains(t, err, "overlaps", "a cluster range is denied like a private one")

	rules, err = kube.Egress(config.Network{Policy: "none"}, nil, false)
	assert.NilError(t, err)
	assert.Equal(t, len(rules), 0)
	assert.Check(t, rules != nil, "an empty list (deny all), not a missing one")
}
