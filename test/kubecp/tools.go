//go:build tools

// Package kubecp pins the control-plane commands `make kube-test` builds.
package kubecp

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
