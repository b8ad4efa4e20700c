// Package kube expresses one task's sealed turn in Kubernetes objects: the
// agent's Pod with the same seal as the podman cage (non-root, no
// capabilities, no privilege escalation, read-only root, shrooms' seccomp
// profile, limits, size-capped memory emptyDirs, no service account token,
// its own user namespace), the task HOME on a PersistentVolumeClaim that an
// init container running `shrooms kube reset-home` (pkg/homereset) resets
// before the agent starts, and a NetworkPolicy with no way to the cluster,
// private, link-local or metadata ranges and DNS only to the cluster's
// resolver. Plain objects (Pod, PVC, NetworkPolicy) or agent-sandbox's
// SandboxTemplate and Sandbox. It only computes; `shrooms kube` prints.
package kube

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/gateway"
	"github.com/shrooms-cage/shrooms/pkg/gitseal"
	"github.com/shrooms-cage/shrooms/pkg/mounts"
	"github.com/shrooms-cage/shrooms/pkg/profile"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/seccomp"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// Paths inside the pod.
const (
	// ShroomsPath is where the init container's image holds the static
	// shrooms binary.
	ShroomsPath = "/usr/local/bin/shrooms"
	// VolumeDir is where the init container mounts the whole HOME claim;
	// the reset's Root (home/ + .shrooms/) is RootDir in it, so the claim's
	// own root, whose owner and mode depend on the provisioner, is never
	// the reset's.
	VolumeDir = "/shrooms/volume"
	RootName  = "shrooms"
	// PolicyDir is the init container's view of the emptyDir it writes the
	// managed policy into; the agent mounts it read-only.
	PolicyDir = "/shrooms/policy"
	// ConfigDir holds config.toml from the task's ConfigMap.
	ConfigDir = "/etc/shrooms"
	// GatewayKeyDir holds the gateway's credential (its Secret), mounted in
	// the gateway container only.
	GatewayKeyDir = "/var/run/shrooms-gateway"
	// SeccompDir is the directory under the kubelet's seccomp root
	// (/var/lib/kubelet/seccomp) that holds shrooms' profile.
	SeccompDir = "shrooms"
)

// Labels on every object.
const (
	LabelTask  = sealed.LabelTask
	LabelAgent = sealed.LabelAgent
	LabelRole  = "io.shrooms.role"
)

// Input is one task's turn on a cluster.
type Input struct {
	Task  string
	Agent string
	// Turn numbers the pod (shrooms-<task>-<turn>).
	Turn int
	Args []string
	// WorktreePVC names a claim mounted at /work ("" : a memory emptyDir).
	WorktreePVC string
	// RuntimeClass is the pod's runtimeClassName (gVisor, Kata), "" none.
	RuntimeClass string
	// Namespace of every object ("" : the one kubectl applies to).
	Namespace string
	// ShroomsImage runs the init container (and the gateway); it holds the
	// static shrooms binary at ShroomsPath.
	ShroomsImage string
	// StorageClass of the HOME claim ("" : the cluster's default).
	StorageClass string
	// ClusterCIDRs are the pod and service ranges, denied like private
	// ranges (most clusters' are inside them already).
	ClusterCIDRs []string
	// ConfigTOML is the config file the init container reads (nil: the
	// built-in defaults).
	ConfigTOML []byte
	// Placeholder is the per-turn credential the agent gets instead of the
	// real one when it uses a gateway.
	Placeholder string
	// Plain selects Pod + PVC + NetworkPolicy instead of agent-sandbox's
	// SandboxTemplate and Sandbox.
	Plain bool
}

// Objects are what Build computes, in apply order.
type Objects struct {
	ConfigMap     *corev1.ConfigMap
	HomeClaim     *corev1.PersistentVolumeClaim
	NetworkPolicy *networkingv1.NetworkPolicy
	Pod           *corev1.Pod      // Plain
	Template      *SandboxTemplate // not Plain
	Sandbox       *Sandbox         // not Plain
}

// YAML is the objects as one multi-document YAML stream.
func (o *Objects) YAML() ([]byte, error) {
	var docs []any
	for _, v := range []any{o.ConfigMap, o.HomeClaim, o.NetworkPolicy, o.Pod, o.Template, o.Sandbox} {
		switch x := v.(type) {
		case *corev1.ConfigMap:
			if x != nil {
				docs = append(docs, x)
			}
		case *corev1.PersistentVolumeClaim:
			if x != nil {
				docs = append(docs, x)
			}
		case *networkingv1.NetworkPolicy:
			if x != nil {
				docs = append(docs, x)
			}
		case *corev1.Pod:
			if x != nil {
				docs = append(docs, x)
			}
		case *SandboxTemplate:
			if x != nil {
				docs = append(docs, x)
			}
		case *Sandbox:
			if x != nil {
				docs = append(docs, x)
			}
		}
	}
	var buf bytes.Buffer
	for i, d := range docs {
		b, err := yaml.Marshal(d)
		if err != nil {
			return nil, fmt.Errorf("kube yaml: %w", err)
		}
		if i > 0 {
			buf.WriteString("---\n")
		}
		buf.Write(b)
	}
	return buf.Bytes(), nil
}

// Names.
func PodName(task taskid.ID, turn int) string { return sealed.Name(task, turn) }
func ConfigMapName(task taskid.ID) string     { return "shrooms-" + task.String() + "-config" }
func PolicyName(task taskid.ID) string        { return "shrooms-" + task.String() }
func TemplateName(task taskid.ID) string      { return "shrooms-" + task.String() }
func HomeClaimName(cfg *config.Config, task taskid.ID) string {
	return cfg.Home.VolumePrefix + task.String()
}
func GatewaySecretName(gw string) string { return "shrooms-gateway-" + gw }

// SeccompProfile is the pod's localhostProfile for cfg ("" for the
// runtime's default profile).
func SeccompProfile(cfg *config.Config) string {
	switch {
	case cfg.Cage.Seccomp == "podman":
		return ""
	case cfg.Cage.Seccomp == "shrooms":
		return SeccompDir + "/" + filepath.Base(seccomp.Path("/"))
	default:
		return SeccompDir + "/" + filepath.Base(cfg.Cage.Seccomp)
	}
}

// Build computes the objects of one turn. Every name is validated first.
func Build(cfg *config.Config, in Input) (*Objects, error) {
	agent, err := cfg.Agent(in.Agent)
	if err != nil {
		return nil, err
	}
	id, err := taskid.Parse(in.Task)
	if err != nil {
		return nil, err
	}
	if in.Turn < 1 {
		return nil, fmt.Errorf("kube: turn %d must be 1 or more", in.Turn)
	}
	names := map[string]string{
		"pod":        PodName(id, in.Turn),
		"HOME claim": HomeClaimName(cfg, id),
		"config map": ConfigMapName(id),
	}
	if in.WorktreePVC != "" {
		names["worktree claim"] = in.WorktreePVC
	}
	if in.Namespace != "" {
		if errs := validation.IsDNS1123Label(in.Namespace); len(errs) > 0 {
			return nil, fmt.Errorf("kube: namespace %q: %s", in.Namespace, strings.Join(errs, "; "))
		}
	}
	for _, what := range slices.Sorted(maps.Keys(names)) {
		if errs := validation.IsDNS1123Subdomain(names[what]); len(errs) > 0 {
			return nil, fmt.Errorf("kube: %s name %q is not a Kubernetes name (task ids on a cluster use a-z 0-9 - . only): %s", what, names[what], strings.Join(errs, "; "))
		}
	}
	if errs := validation.IsDNS1123Label(PolicyName(id)); len(errs) > 0 {
		return nil, fmt.Errorf("kube: task %q is too long or not a DNS label for a cluster: %s", in.Task, strings.Join(errs, "; "))
	}
	if in.RuntimeClass != "" {
		if errs := validation.IsDNS1123Subdomain(in.RuntimeClass); len(errs) > 0 {
			return nil, fmt.Errorf("kube: runtime class %q: %s", in.RuntimeClass, strings.Join(errs, "; "))
		}
	}
	if in.ShroomsImage == "" {
		return nil, fmt.Errorf("kube: no image for the init container (--shrooms-image)")
	}
	var gw *config.Gateway
	if agent.Gateway != "" {
		g := cfg.Gateway[agent.Gateway]
		if g.Auth != "api-key" {
			return nil, fmt.Errorf("kube: gateway %q uses auth %q; on a cluster only api-key gateways are supported (the key comes from a Secret)", agent.Gateway, g.Auth)
		}
		if in.Placeholder == "" {
			return nil, fmt.Errorf("kube: agent %q uses gateway %q but no placeholder was given", in.Agent, agent.Gateway)
		}
		gw = &g
	}
	if len(agent.TokenEnv) > 0 {
		return nil, fmt.Errorf("kube: agent %q passes tokens into the cage (token_env); on a cluster use a gateway, which keeps the credential out of the agent container", in.Agent)
	}
	egress, err := Egress(cfg.Network, in.ClusterCIDRs, gw != nil)
	if err != nil {
		return nil, err
	}

	labels := map[string]string{sealed.LabelManaged: "1", LabelTask: in.Task, LabelAgent: in.Agent}
	meta := func(name, role string) metav1.ObjectMeta {
		l := maps.Clone(labels)
		l[LabelRole] = role
		return metav1.ObjectMeta{Name: name, Namespace: in.Namespace, Labels: l}
	}
	spec, err := podSpec(cfg, id, in, agent, gw)
	if err != nil {
		return nil, err
	}
	o := &Objects{}
	o.ConfigMap = &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: meta(ConfigMapName(id), "config"),
		Data:       map[string]string{"config.toml": string(in.ConfigTOML)},
	}
	homeSize := resource.NewQuantity(int64(cfg.Home.Size), resource.BinarySI)
	o.HomeClaim = &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: meta(HomeClaimName(cfg, id), "home"),
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *homeSize}},
		},
	}
	if in.StorageClass != "" {
		sc := in.StorageClass
		o.HomeClaim.Spec.StorageClassName = &sc
	}
	// The pods of the task (the plain Pod, the Sandbox's pod) are selected by
	// task label; a SandboxTemplate's own pods get the same rules from the
	// agent-sandbox controller.
	podSel := metav1.LabelSelector{MatchLabels: map[string]string{LabelTask: in.Task, LabelRole: "turn"}}
	o.NetworkPolicy = &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: meta(PolicyName(id), "network"),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: podSel,
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{}, // none: nothing may connect to a cage
			Egress:      egress,
		},
	}
	podLabels := maps.Clone(labels)
	podLabels[LabelRole] = "turn"
	if in.Plain {
		m := meta(PodName(id, in.Turn), "turn")
		m.Labels = podLabels
		o.Pod = &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: m, Spec: spec}
		return o, nil
	}
	no := false
	bp := SandboxBlueprint{PodTemplate: PodTemplate{Spec: spec, ObjectMeta: PodMetadata{Labels: podLabels}}, Service: &no}
	o.Template = &SandboxTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: TemplateAPIVersion, Kind: "SandboxTemplate"},
		ObjectMeta: meta(TemplateName(id), "template"),
		Spec: SandboxTemplateSpec{
			SandboxBlueprint:        bp,
			NetworkPolicy:           &NetworkPolicySpec{Egress: egress},
			NetworkPolicyManagement: "Managed",
			// A claim must not change the sealed environment (e.g. the
			// gateway's base URL).
			EnvVarsInjectionPolicy: "Disallowed",
		},
	}
	o.Sandbox = &Sandbox{
		TypeMeta:   metav1.TypeMeta{APIVersion: SandboxAPIVersion, Kind: "Sandbox"},
		ObjectMeta: meta(PodName(id, in.Turn), "turn"),
		Spec:       SandboxSpec{SandboxBlueprint: bp, OperatingMode: "Running"},
	}
	return o, nil
}

func podSpec(cfg *config.Config, id taskid.ID, in Input, agent config.Agent, gw *config.Gateway) (corev1.PodSpec, error) {
	yes, no := true, false
	user := cfg.Cage.User
	memSize := func(n config.Size) *resource.Quantity { return resource.NewQuantity(int64(n), resource.BinarySI) }
	memDir := func(n config.Size) corev1.VolumeSource {
		return corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: memSize(n)}}
	}
	grace := int64(math.Ceil(cfg.Cage.StopGrace.Std().Seconds()))
	deadline := int64(math.Ceil(cfg.Cage.Timeout.Std().Seconds()))

	seccompProfile := func() *corev1.SeccompProfile {
		if p := SeccompProfile(cfg); p != "" {
			return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: &p}
		}
		return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	}
	// Every container of the pod runs as cage.user; the kubelet gives the
	// HOME claim to its group (fsGroup) the first time, so the reset can
	// make its root there without privilege. OnRootMismatch: later pods
	// find the claim's root in order and the kubelet does not walk (and
	// make group-writable) the tree the reset keeps.
	onRootMismatch := corev1.FSGroupChangeOnRootMismatch
	sc := &corev1.PodSecurityContext{
		RunAsUser: &user, RunAsGroup: &user, RunAsNonRoot: &yes,
		FSGroup: &user, FSGroupChangePolicy: &onRootMismatch,
		SeccompProfile: seccompProfile(),
	}
	// sealedContext is the securityContext of every container: the seal
	// restricted PodSecurity asks for, and more.
	sealedContext := func(uid int64) *corev1.SecurityContext {
		return &corev1.SecurityContext{
			RunAsUser: &uid, RunAsGroup: &uid, RunAsNonRoot: &yes,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes, Privileged: &no,
			SeccompProfile: seccompProfile(),
		}
	}

	volumes := []corev1.Volume{
		{Name: "home", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: HomeClaimName(cfg, id)}}},
		{Name: "policy", VolumeSource: memDir(1 << 20)},
		{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: ConfigMapName(id)}}}},
		{Name: "tmp", VolumeSource: memDir(cfg.Cage.TmpSize)},
		{Name: "run", VolumeSource: memDir(cfg.Cage.RunSize)},
	}
	if in.WorktreePVC != "" {
		volumes = append(volumes, corev1.Volume{Name: "work", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: in.WorktreePVC}}})
	} else {
		volumes = append(volumes, corev1.Volume{Name: "work", VolumeSource: memDir(cfg.Cage.TmpSize)})
	}

	// The reset: the agent's own uid, no capabilities. It owns the claim's
	// shrooms/ (made there by the first reset); the agent never sees it,
	// as it mounts only shrooms/home.
	resetArgs := []string{"--config", ConfigDir + "/config.toml", "kube", "reset-home",
		"--agent", in.Agent, "--root", VolumeDir + "/" + RootName, "--policy", PolicyDir,
		"--uid", strconv.FormatInt(user, 10), "--gid", strconv.FormatInt(user, 10)}
	if gw != nil {
		resetArgs = append(resetArgs, "--gateway", "--gateway-api", gw.API)
	}
	reset := corev1.Container{
		Name:            "shrooms-reset",
		Image:           in.ShroomsImage,
		ImagePullPolicy: PullPolicy(in.ShroomsImage),
		Command:         []string{ShroomsPath},
		Args:            resetArgs,
		SecurityContext: sealedContext(user),
		VolumeMounts: []corev1.VolumeMount{
			{Name: "home", MountPath: VolumeDir},
			{Name: "policy", MountPath: PolicyDir},
			{Name: "config", MountPath: ConfigDir, ReadOnly: true},
		},
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("256Mi"), corev1.ResourceCPU: resource.MustParse("1"),
		}},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}

	env := map[string]string{
		"HOME": mounts.HomeDir, "USER": "agent", "LOGNAME": "agent",
		"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
	}
	maps.Copy(env, agent.Env)
	maps.Copy(env, gitseal.CageEnv())
	initContainers := []corev1.Container{reset}
	if gw != nil {
		if gw.API == "openai" {
			env["OPENAI_BASE_URL"] = gateway.BaseURL() + "/v1"
			env["OPENAI_API_KEY"] = in.Placeholder
		} else {
			env["ANTHROPIC_BASE_URL"] = gateway.BaseURL()
			env["ANTHROPIC_API_KEY"] = in.Placeholder
		}
		always := corev1.ContainerRestartPolicyAlways
		nobody := int64(65534)
		volumes = append(volumes, corev1.Volume{Name: "gateway-key", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: GatewaySecretName(agent.Gateway), DefaultMode: ptr(int32(0o400))}}})
		// A native sidecar: started after the reset, running beside the
		// agent, holding the only copy of the credential in the pod.
		initContainers = append(initContainers, corev1.Container{
			Name:            "gateway",
			Image:           in.ShroomsImage,
			ImagePullPolicy: PullPolicy(in.ShroomsImage),
			Command:         []string{ShroomsPath},
			Args:            gatewayArgs(gw),
			Env:             []corev1.EnvVar{{Name: "SHROOMS_PLACEHOLDER", Value: in.Placeholder}},
			RestartPolicy:   &always,
			SecurityContext: sealedContext(nobody),
			VolumeMounts:    []corev1.VolumeMount{{Name: "gateway-key", MountPath: GatewayKeyDir, ReadOnly: true}},
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				corev1.ResourceMemory: resource.MustParse("128Mi"), corev1.ResourceCPU: resource.MustParse("500m"),
			}},
		})
	}
	var envVars []corev1.EnvVar
	for _, k := range slices.Sorted(maps.Keys(env)) {
		envVars = append(envVars, corev1.EnvVar{Name: k, Value: env[k]})
	}

	agentMounts := []corev1.VolumeMount{
		{Name: "home", MountPath: mounts.HomeDir, SubPath: RootName + "/home"},
		{Name: "work", MountPath: mounts.WorkDir},
		{Name: "tmp", MountPath: "/tmp"},
		{Name: "run", MountPath: "/run"},
	}
	for _, p := range slices.Sorted(slices.Values(agent.Home)) {
		if prof, _ := profile.Lookup(p); prof.PolicyDir != "" {
			agentMounts = append(agentMounts, corev1.VolumeMount{Name: "policy", MountPath: prof.PolicyDest, SubPath: prof.PolicyDir, ReadOnly: true})
		}
	}
	cpu := resource.NewMilliQuantity(int64(math.Round(cfg.Cage.CPUs*1000)), resource.DecimalSI)
	limits := corev1.ResourceList{corev1.ResourceMemory: *memSize(cfg.Cage.Memory), corev1.ResourceCPU: *cpu}
	command := append(append([]string{}, agent.Command...), in.Args...)
	agentC := corev1.Container{
		Name:                     "agent",
		Image:                    cfg.ImageFor(agent),
		ImagePullPolicy:          PullPolicy(cfg.ImageFor(agent)),
		Command:                  command,
		Env:                      envVars,
		WorkingDir:               mounts.WorkDir,
		SecurityContext:          sealedContext(user),
		VolumeMounts:             agentMounts,
		Resources:                corev1.ResourceRequirements{Limits: limits, Requests: limits},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	spec := corev1.PodSpec{
		InitContainers:                initContainers,
		Containers:                    []corev1.Container{agentC},
		Volumes:                       volumes,
		RestartPolicy:                 corev1.RestartPolicyNever,
		TerminationGracePeriodSeconds: &grace,
		ActiveDeadlineSeconds:         &deadline,
		AutomountServiceAccountToken:  &no,
		EnableServiceLinks:            &no, // no environment naming the cluster's services
		HostUsers:                     &no,
		Hostname:                      fmt.Sprintf(cfg.Cage.HostnameFmt, in.Task),
		SecurityContext:               sc,
	}
	if in.RuntimeClass != "" {
		rc := in.RuntimeClass
		spec.RuntimeClassName = &rc
	}
	if errs := validation.IsDNS1123Label(spec.Hostname); len(errs) > 0 {
		return spec, fmt.Errorf("kube: hostname %q (cage.hostname_format): %s", spec.Hostname, strings.Join(errs, "; "))
	}
	return spec, nil
}

func ptr[T any](v T) *T { return &v }

// PullPolicy is the imagePullPolicy of image. "localhost/..." is podman's
// name for an image built or loaded on this machine: no registry serves
// it, so a node must already hold it (imported, e.g. `ctr -n k8s.io images
// import`) and never tries to pull it. A registry image pinned by digest,
// or by a tag other than "latest", is pulled if absent; a "latest" or
// untagged one every time (the tag moves).
func PullPolicy(image string) corev1.PullPolicy {
	if strings.HasPrefix(image, "localhost/") {
		return corev1.PullNever
	}
	if strings.Contains(image, "@") {
		return corev1.PullIfNotPresent
	}
	name := image[strings.LastIndex(image, "/")+1:]
	if i := strings.LastIndex(name, ":"); i >= 0 && name[i+1:] != "latest" {
		return corev1.PullIfNotPresent
	}
	return corev1.PullAlways
}

// dnsPorts mirror the seal: DNS, DoT, mDNS, LLMNR and NetBIOS name ports
// reach nothing but the cluster's resolver.
var dnsPorts = []int32{53, 137, 138, 853, 5353, 5355}

// Egress is the NetworkPolicy egress of a cage under network (the same
// policy as the seal): cluster DNS only on port 53; "internet" public
// addresses on every other port, never the blocked or cluster ranges;
// "allowlist" the listed CIDRs only (NetworkPolicy matches addresses, so
// host names are refused); "none" nothing. A pod whose agent uses a
// gateway also reaches public addresses on 443 (the gateway container
// shares the pod's network).
func Egress(n config.Network, clusterCIDRs []string, gatewayUpstream bool) ([]networkingv1.NetworkPolicyEgressRule, error) {
	var deny4, deny6 []string
	deny4 = append(deny4, firewall.Blocked4...)
	for _, b := range firewall.Blocked6 {
		// The API server refuses IPv4-mapped prefixes in an ipBlock. None is
		// needed: a pod's packet to ::ffff:a.b.c.d leaves as IPv4, judged
		// by the IPv4 rules, and ::/3 (blocked too) covers the range.
		if !netip.MustParsePrefix(b).Addr().Is4In6() {
			deny6 = append(deny6, b)
		}
	}
	for _, c := range clusterCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil || p.Masked() != p {
			return nil, fmt.Errorf("kube: cluster CIDR %q is not a network CIDR", c)
		}
		if p.Addr().Is4() {
			deny4 = appendUncovered(deny4, p)
		} else {
			deny6 = appendUncovered(deny6, p)
		}
	}
	denied := func(p netip.Prefix) bool {
		list := deny4
		if p.Addr().Is6() {
			list = deny6
		}
		for _, d := range list {
			dp := netip.MustParsePrefix(d)
			if dp.Overlaps(p) {
				return true
			}
		}
		return false
	}
	public := []networkingv1.NetworkPolicyPeer{
		{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: deny4}},
		{IPBlock: &networkingv1.IPBlock{CIDR: "::/0", Except: deny6}},
	}
	dns := networkingv1.NetworkPolicyEgressRule{
		To: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
		}},
		Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolUDP, 53, 0), port(corev1.ProtocolTCP, 53, 0)},
	}
	var rules []networkingv1.NetworkPolicyEgressRule
	switch n.Policy {
	case "none":
	case "internet":
		rules = append(rules, dns, networkingv1.NetworkPolicyEgressRule{To: public, Ports: allPortsBut(dnsPorts)})
	case "allowlist":
		var peers []networkingv1.NetworkPolicyPeer
		for i, a := range n.Allow {
			p, err := netip.ParsePrefix(a)
			if err != nil {
				addr, aerr := netip.ParseAddr(a)
				if aerr != nil {
					return nil, &config.Error{Key: fmt.Sprintf("network.allow[%d]", i), Msg: fmt.Sprintf("%q: a NetworkPolicy matches addresses, not host names; give its CIDRs (or use a CNI with FQDN policies)", a)}
				}
				p = netip.PrefixFrom(addr, addr.BitLen())
			}
			if p.Addr().Is4In6() {
				return nil, &config.Error{Key: fmt.Sprintf("network.allow[%d]", i), Msg: fmt.Sprintf("%q is IPv4-mapped IPv6, which a NetworkPolicy cannot hold; give the IPv4 address", a)}
			}
			p = p.Masked()
			if denied(p) {
				return nil, &config.Error{Key: fmt.Sprintf("network.allow[%d]", i), Msg: fmt.Sprintf("%s overlaps a private, link-local, metadata or cluster range", p)}
			}
			peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: p.String()}})
		}
		if len(peers) > 0 {
			rules = append(rules, networkingv1.NetworkPolicyEgressRule{To: peers, Ports: allPortsBut(dnsPorts)})
		}
	default:
		return nil, fmt.Errorf("kube: unknown network policy %q", n.Policy)
	}
	if gatewayUpstream && n.Policy != "internet" {
		rules = append(rules, dns, networkingv1.NetworkPolicyEgressRule{To: public, Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, 443, 0)}})
	}
	if rules == nil {
		rules = []networkingv1.NetworkPolicyEgressRule{} // deny all egress
	}
	return rules, nil
}

// appendUncovered adds p to list unless a prefix of list contains it.
func appendUncovered(list []string, p netip.Prefix) []string {
	for _, d := range list {
		dp := netip.MustParsePrefix(d)
		if dp.Bits() <= p.Bits() && dp.Contains(p.Addr()) {
			return list
		}
	}
	return append(list, p.String())
}

func port(proto corev1.Protocol, from, to int32) networkingv1.NetworkPolicyPort {
	pr := proto
	p := intstr.FromInt32(from)
	np := networkingv1.NetworkPolicyPort{Protocol: &pr, Port: &p}
	if to > from {
		np.EndPort = &to
	}
	return np
}

// allPortsBut is every TCP and UDP port except the given ones, as ranges.
func allPortsBut(except []int32) []networkingv1.NetworkPolicyPort {
	var out []networkingv1.NetworkPolicyPort
	for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		from := int32(1)
		for _, e := range except {
			if e > from {
				out = append(out, port(proto, from, e-1))
			}
			from = e + 1
		}
		out = append(out, port(proto, from, 65535))
	}
	return out
}

// gatewayArgs is the gateway sidecar's command line.
func gatewayArgs(gw *config.Gateway) []string {
	args := []string{"kube", "gateway", "--api", gw.API, "--upstream", gw.Upstream, "--key-file", GatewayKeyDir + "/key", "--placeholder-env", "SHROOMS_PLACEHOLDER"}
	for _, b := range gw.AllowBetas {
		args = append(args, "--allow-beta", b)
	}
	for _, t := range gw.AllowServerTools {
		args = append(args, "--allow-server-tool", t)
	}
	return args
}
