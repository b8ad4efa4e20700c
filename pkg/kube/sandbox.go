package kube

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The agent-sandbox API (kubernetes-sigs/agent-sandbox), v1beta1. Its Go
// module (sigs.k8s.io/agent-sandbox) is not served by the Go module proxy,
// so these are the subset of its published types that shrooms emits, with
// the same JSON names as api/v1beta1/sandbox_types.go and
// extensions/api/v1beta1/sandboxtemplate_types.go. Status is left out: it
// is the controller's to write.
const (
	SandboxAPIVersion  = "agents.x-k8s.io/v1beta1"
	TemplateAPIVersion = "extensions.agents.x-k8s.io/v1beta1"
)

// PodMetadata is agent-sandbox's PodMetadata.
type PodMetadata struct {
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// PodTemplate is agent-sandbox's PodTemplate (a PodSpec and pod metadata).
type PodTemplate struct {
	Spec       corev1.PodSpec `json:"spec"`
	ObjectMeta PodMetadata    `json:"metadata"`
}

// SandboxBlueprint is what Sandbox and SandboxTemplate share. shrooms keeps
// the task HOME on a claim of its own (it outlives every turn's sandbox),
// so volumeClaimTemplates stay empty.
type SandboxBlueprint struct {
	PodTemplate PodTemplate `json:"podTemplate"`
	Service     *bool       `json:"service,omitempty"`
}

// SandboxSpec is agent-sandbox's SandboxSpec (lifecycle fields unused).
type SandboxSpec struct {
	SandboxBlueprint `json:",inline"`
	OperatingMode    string `json:"operatingMode,omitempty"`
}

// Sandbox is one turn's sandbox (agents.x-k8s.io/v1beta1).
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxSpec `json:"spec"`
}

// NetworkPolicySpec is agent-sandbox's template NetworkPolicySpec: the
// controller selects the template's pods itself.
type NetworkPolicySpec struct {
	Ingress []networkingv1.NetworkPolicyIngressRule `json:"ingress,omitempty"`
	Egress  []networkingv1.NetworkPolicyEgressRule  `json:"egress,omitempty"`
}

// SandboxTemplateSpec is agent-sandbox's SandboxTemplateSpec.
type SandboxTemplateSpec struct {
	SandboxBlueprint        `json:",inline"`
	NetworkPolicy           *NetworkPolicySpec `json:"networkPolicy,omitempty"`
	NetworkPolicyManagement string             `json:"networkPolicyManagement,omitempty"`
	EnvVarsInjectionPolicy  string             `json:"envVarsInjectionPolicy,omitempty"`
}

// SandboxTemplate is a task's template (extensions.agents.x-k8s.io/v1beta1),
// for SandboxWarmPool and SandboxClaim.
type SandboxTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxTemplateSpec `json:"spec"`
}
