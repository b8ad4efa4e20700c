//go:build kubeapi

// Package kubeapi_test holds what `shrooms kube` emits against a real
// kube-apiserver (with etcd) on loopback: `make kube-test`.
package kubeapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/shrooms-cage/shrooms/internal/kubecases"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/kube"
)

const ns = "shrooms-restricted"

// resourcePath is where a document of `shrooms kube` is created.
func resourcePath(apiVersion, kind string) (string, error) {
	switch apiVersion + " " + kind {
	case "v1 ConfigMap":
		return nsPath(ns, "", "configmaps"), nil
	case "v1 PersistentVolumeClaim":
		return nsPath(ns, "", "persistentvolumeclaims"), nil
	case "v1 Pod":
		return nsPath(ns, "", "pods"), nil
	case "networking.k8s.io/v1 NetworkPolicy":
		return nsPath(ns, "networking.k8s.io/v1", "networkpolicies"), nil
	case kube.SandboxAPIVersion + " Sandbox":
		return nsPath(ns, kube.SandboxAPIVersion, "sandboxes"), nil
	case kube.TemplateAPIVersion + " SandboxTemplate":
		return nsPath(ns, kube.TemplateAPIVersion, "sandboxtemplates"), nil
	}
	return "", fmt.Errorf("no resource for %s %s", apiVersion, kind)
}

// TestRestrictedAdmission creates every object `shrooms kube` emits (each
// agent of the built-in and example configs, each network policy, plain and
// agent-sandbox; internal/kubecases) in a namespace that enforces
// PodSecurity restricted:latest, with fieldValidation=Strict: each is
// admitted with no warning. The agent-sandbox kinds are served by CRDs
// whose schemas come from pkg/kube's mirrored types, and the pod a
// Sandbox stands for (its podTemplate, as the agent-sandbox controller
// would create it) is created too, so PodSecurity judges it.
func TestRestrictedAdmission(t *testing.T) {
	cp := startControlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	cp.mustCreate(t, ctx, "/api/v1/namespaces", map[string]any{"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": ns, "labels": map[string]string{
			"pod-security.kubernetes.io/enforce":         "restricted",
			"pod-security.kubernetes.io/enforce-version": "latest",
			"pod-security.kubernetes.io/warn":            "restricted",
			"pod-security.kubernetes.io/warn-version":    "latest",
		}}})
	// The service account controller's part: ServiceAccount admission
	// refuses a pod whose account does not exist.
	cp.mustCreate(t, ctx, nsPath(ns, "", "serviceaccounts"), map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "default"}})
	// What a cluster with gVisor has (the RuntimeClass admission plugin
	// refuses a pod naming one that does not exist).
	cp.mustCreate(t, ctx, "/apis/node.k8s.io/v1/runtimeclasses", map[string]any{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": map[string]any{"name": "gvisor"}, "handler": "runsc"})
	for _, c := range sandboxCRDs(t) {
		cp.mustCreate(t, ctx, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", c)
	}
	cp.waitServed(t, ctx, nsPath(ns, kube.SandboxAPIVersion, "sandboxes"))
	cp.waitServed(t, ctx, nsPath(ns, kube.TemplateAPIVersion, "sandboxtemplates"))

	t.Run("strict schema", func(t *testing.T) { strictSchema(t, ctx, cp) })
	t.Run("positive control", func(t *testing.T) { refusesPrivilege(t, ctx, cp) })

	example, err := os.ReadFile("../../config.example.toml")
	assert.NilError(t, err)
	cases, err := kubecases.All(example)
	assert.NilError(t, err)
	counts := map[string]int{}
	for i, c := range cases {
		in := c.Input
		in.Task = fmt.Sprintf("c%d", i)
		in.Namespace = ns
		objs, err := kube.Build(c.Config, in)
		assert.NilError(t, err, c.Name)
		out, err := objs.YAML() // what `shrooms kube` prints
		assert.NilError(t, err, c.Name)
		for _, doc := range strings.Split(string(out), "\n---\n") {
			var meta metav1.TypeMeta
			assert.NilError(t, yaml.Unmarshal([]byte(doc), &meta))
			path, err := resourcePath(meta.APIVersion, meta.Kind)
			assert.NilError(t, err, c.Name)
			obj, err := yaml.YAMLToJSON([]byte(doc))
			assert.NilError(t, err)
			body := cp.mustCreate(t, ctx, path, json.RawMessage(obj))
			counts[meta.Kind]++
			if meta.Kind == "Pod" {
				checkStored(t, c.Name, body)
			}
		}
		if objs.Sandbox != nil {
			// The pod the controller makes of the Sandbox.
			pod := corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
				ObjectMeta: metav1.ObjectMeta{Name: objs.Sandbox.Name, Namespace: ns, Labels: objs.Sandbox.Spec.PodTemplate.ObjectMeta.Labels},
				Spec:       objs.Sandbox.Spec.PodTemplate.Spec}
			checkStored(t, c.Name+" sandbox pod", cp.mustCreate(t, ctx, nsPath(ns, "", "pods"), pod))
			counts["Pod (of a Sandbox)"]++
		}
	}
	t.Logf("admitted under restricted:latest with fieldValidation=Strict, no warnings: %v", counts)
	assert.Check(t, counts["Pod"] > 20 && counts["Sandbox"] > 20 && counts["SandboxTemplate"] > 20, "%v", counts)
}

// checkStored: the API server kept the seal (a field it dropped, e.g.
// behind a disabled feature gate, would not show as a warning).
func checkStored(t *testing.T, name string, body []byte) {
	t.Helper()
	var pod corev1.Pod
	assert.NilError(t, json.Unmarshal(body, &pod))
	assert.Check(t, pod.Spec.HostUsers != nil && !*pod.Spec.HostUsers, "%s: hostUsers not kept", name)
	assert.Check(t, pod.Spec.SecurityContext.FSGroupChangePolicy != nil, "%s: fsGroupChangePolicy not kept", name)
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		assert.Check(t, c.ImagePullPolicy == kube.PullPolicy(c.Image), "%s: %s pull policy %s", name, c.Name, c.ImagePullPolicy)
	}
}

// strictSchema: the CRDs' schemas are strict — a field the mirrored types
// do not have is refused under fieldValidation=Strict, in the pod template
// as at the top of the spec.
func strictSchema(t *testing.T, ctx context.Context, cp *controlPlane) {
	for _, doc := range []string{
		`{"apiVersion":"agents.x-k8s.io/v1beta1","kind":"Sandbox","metadata":{"name":"unknown-1"},"spec":{"podTemplat":{}}}`,
		`{"apiVersion":"agents.x-k8s.io/v1beta1","kind":"Sandbox","metadata":{"name":"unknown-2"},"spec":{"podTemplate":{"metadata":{},"spec":{"containers":[{"name":"a","image":"x","securityContext":{"runAsUsr":1}}]}}}}`,
	} {
		code, body, _, err := cp.create(ctx, nsPath(ns, kube.SandboxAPIVersion, "sandboxes"), json.RawMessage(doc))
		assert.NilError(t, err)
		assert.Equal(t, code, http.StatusBadRequest, "%s", body)
		assert.Check(t, is.Contains(string(body), "unknown field"))
	}
}

// refusesPrivilege: the namespace really enforces restricted. The emitted
// pod with one added capability, and the reset as it was (root with CHOWN
// DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID), are refused with
// PodSecurity's message; the same pod unchanged is admitted.
func refusesPrivilege(t *testing.T, ctx context.Context, cp *controlPlane) {
	cfg := config.Default()
	objs, err := kube.Build(cfg, kube.Input{Task: "control", Agent: "claude", Turn: 1, Namespace: ns, ShroomsImage: "localhost/shrooms:latest", Plain: true})
	assert.NilError(t, err)

	ptrace := objs.Pod.DeepCopy()
	ptrace.Name = "control-ptrace"
	ptrace.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_PTRACE"}
	code, body, _, err := cp.create(ctx, nsPath(ns, "", "pods"), ptrace)
	assert.NilError(t, err)
	assert.Equal(t, code, http.StatusForbidden, "%s", body)
	assert.Check(t, is.Contains(string(body), `pods \"control-ptrace\" is forbidden: violates PodSecurity \"restricted:latest\": unrestricted capabilities (container \"agent\" must not include \"SYS_PTRACE\" in securityContext.capabilities.add)`))

	old := objs.Pod.DeepCopy()
	old.Name = "control-old-reset"
	root, no := int64(0), false
	r := old.Spec.InitContainers[0].SecurityContext
	r.RunAsUser, r.RunAsGroup, r.RunAsNonRoot = &root, &root, &no
	r.Capabilities.Add = []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID"}
	code, body, _, err = cp.create(ctx, nsPath(ns, "", "pods"), old)
	assert.NilError(t, err)
	assert.Equal(t, code, http.StatusForbidden, "%s", body)
	assert.Check(t, is.Contains(string(body), `violates PodSecurity \"restricted:latest\": unrestricted capabilities (container \"shrooms-reset\" must not include \"CHOWN\", \"DAC_OVERRIDE\", \"DAC_READ_SEARCH\", \"FOWNER\", \"FSETID\" in securityContext.capabilities.add)`))

	objs.Pod.Name = "control-as-emitted"
	cp.mustCreate(t, ctx, nsPath(ns, "", "pods"), objs.Pod)
}
