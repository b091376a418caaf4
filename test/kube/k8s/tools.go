//go:build tools

// Package k8s pins the Kubernetes commands that make kube-e2e builds from this module.
package k8s

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
