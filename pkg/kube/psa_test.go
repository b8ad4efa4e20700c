package kube_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"

	"github.com/shrooms-cage/shrooms/internal/kubecases"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/kube"
)

// podSecurity evaluates a pod as the PodSecurity admission plugin does for a
// namespace enforcing lv, and returns its refusal ("" when admitted).
func podSecurity(t *testing.T, lv psaapi.LevelVersion, meta metav1.ObjectMeta, spec corev1.PodSpec) string {
	t.Helper()
	e, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	assert.NilError(t, err)
	res := policy.AggregateCheckResults(e.EvaluatePod(lv, &meta, &spec))
	if res.Allowed {
		return ""
	}
	// The admission plugin's own wording (admission.go).
	return fmt.Sprintf("violates PodSecurity %q: %s", lv.String(), res.ForbiddenDetail())
}

var restricted = psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}

// podsOf are the pods an emitted case runs: the plain Pod, or the
// Sandbox's and the SandboxTemplate's pod templates.
func podsOf(o *kube.Objects) map[string]corev1.Pod {
	pods := map[string]corev1.Pod{}
	if o.Pod != nil {
		pods["Pod"] = *o.Pod
	}
	if o.Sandbox != nil {
		pods["Sandbox"] = corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: o.Sandbox.Spec.PodTemplate.ObjectMeta.Labels}, Spec: o.Sandbox.Spec.PodTemplate.Spec}
	}
	if o.Template != nil {
		pods["SandboxTemplate"] = corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: o.Template.Spec.PodTemplate.ObjectMeta.Labels}, Spec: o.Template.Spec.PodTemplate.Spec}
	}
	return pods
}

func cases(t *testing.T) []kubecases.Case {
	t.Helper()
	example, err := os.ReadFile("../../config.example.toml")
	assert.NilError(t, err)
	cs, err := kubecases.All(example)
	assert.NilError(t, err)
	return cs
}

// TestPodSecurityRestricted: every pod `shrooms kube` emits (each agent of
// the built-in and example configs, each network policy, plain and
// agent-sandbox) passes PodSecurity "restricted" at the latest version,
// judged by k8s.io/pod-security-admission's own evaluator.
func TestPodSecurityRestricted(t *testing.T) {
	n := 0
	for _, c := range cases(t) {
		objs, err := kube.Build(c.Config, c.Input)
		assert.NilError(t, err, c.Name)
		pods := podsOf(objs)
		if c.Input.Plain {
			assert.Equal(t, len(pods), 1, c.Name)
		} else {
			assert.Equal(t, len(pods), 2, c.Name)
		}
		for kind, p := range pods {
			assert.Check(t, is.Equal(podSecurity(t, restricted, p.ObjectMeta, p.Spec), ""), "%s %s", c.Name, kind)
			n++
		}
	}
	assert.Check(t, n >= 50, "only %d pods evaluated", n)
	t.Logf("%d pods admitted at %s", n, restricted)
}

// The evaluator refuses what restricted forbids, with PodSecurity's message:
// the reset as it was before (root, CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER
// FSETID) is refused already at baseline; one added capability on any
// container is refused at restricted, and so is runAsUser 0 in a pod that
// shares the node's user namespace.
func TestPodSecurityRefusesPrivilege(t *testing.T) {
	objs, err := kube.Build(config.Default(), kube.Input{Task: "t1", Agent: "claude", Turn: 1, ShroomsImage: "localhost/shrooms:latest", Plain: true})
	assert.NilError(t, err)
	pod := *objs.Pod
	assert.Equal(t, podSecurity(t, restricted, pod.ObjectMeta, pod.Spec), "", "positive control: the emitted pod is admitted")

	before := pod.DeepCopy()
	root := int64(0)
	no := false
	r := before.Spec.InitContainers[0].SecurityContext
	r.RunAsUser, r.RunAsGroup, r.RunAsNonRoot = &root, &root, &no
	r.Capabilities.Add = []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID"}
	msg := podSecurity(t, psaapi.LevelVersion{Level: psaapi.LevelBaseline, Version: psaapi.LatestVersion()}, before.ObjectMeta, before.Spec)
	assert.Check(t, is.Contains(msg, `violates PodSecurity "baseline:latest": non-default capabilities (container "shrooms-reset" must not include "DAC_READ_SEARCH" in securityContext.capabilities.add)`))
	msg = podSecurity(t, restricted, before.ObjectMeta, before.Spec)
	assert.Check(t, is.Contains(msg, `violates PodSecurity "restricted:latest"`))
	assert.Check(t, is.Contains(msg, `unrestricted capabilities (container "shrooms-reset" must not include "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID" in securityContext.capabilities.add)`))
	// In its own user namespace (hostUsers: false) root of the pod is not
	// root of the node, and restricted leaves runAsUser and runAsNonRoot be
	// (PSA 1.33+); in the node's user namespace they are refused too.
	assert.Check(t, !strings.Contains(msg, "runAsUser=0"), msg)
	before.Spec.HostUsers = nil
	msg = podSecurity(t, restricted, before.ObjectMeta, before.Spec)
	assert.Check(t, is.Contains(msg, `runAsNonRoot != true (container "shrooms-reset" must not set securityContext.runAsNonRoot=false)`))
	assert.Check(t, is.Contains(msg, `runAsUser=0 (container "shrooms-reset" must not set runAsUser=0)`))

	for i := range len(pod.Spec.InitContainers) + len(pod.Spec.Containers) {
		p := pod.DeepCopy()
		c := &p.Spec.Containers[0]
		if i < len(p.Spec.InitContainers) {
			c = &p.Spec.InitContainers[i]
		}
		c.SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_PTRACE"}
		assert.Check(t, is.Contains(podSecurity(t, restricted, p.ObjectMeta, p.Spec), fmt.Sprintf(`container %q must not include "SYS_PTRACE" in securityContext.capabilities.add`, c.Name)))
		p = pod.DeepCopy()
		c = &p.Spec.Containers[0]
		if i < len(p.Spec.InitContainers) {
			c = &p.Spec.InitContainers[i]
		}
		c.SecurityContext.RunAsUser = &root
		p.Spec.HostUsers = nil
		assert.Check(t, is.Contains(podSecurity(t, restricted, p.ObjectMeta, p.Spec), fmt.Sprintf(`runAsUser=0 (container %q must not set runAsUser=0)`, c.Name)))
	}
}

// The evaluator (and the test-only case matrix) stay out of the shrooms
// binary: only tests import them.
func TestEvaluatorNotInBinary(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(goBin, "list", "-deps", "-tags", "remote exclude_graphdriver_btrfs containers_image_openpgp exclude_graphdriver_devicemapper", "./cmd/shrooms")
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	assert.NilError(t, err, "%s", out)
	assert.Check(t, is.Contains(string(out), "k8s.io/api/core/v1"), "positive control: the binary does use k8s.io/api")
	for _, p := range []string{"k8s.io/pod-security-admission", "github.com/shrooms-cage/shrooms/internal/kubecases"} {
		assert.Check(t, !strings.Contains(string(out), p), "%s is linked into shrooms", p)
	}
}
