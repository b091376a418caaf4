package kube

import (
	"context"
	"crypto/x509/pkix"
	"fmt"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// numbersAllocdReplicas is how many allocd replicas serve the webhook's side.
const numbersAllocdReplicas = 2

// startWebhookSide is kube-apiserver with allocd's webhook on e: allocd (two replicas,
// each with Go's profiles on a port of its own), the bridge (which binds what the
// webhook allocated, and releases what deleted Services held), and two webhook
// replicas registered with failurePolicy Fail, as deploy/kube has them.
func startWebhookSide(t *testing.T, e *etcdtest.Server) *createSide {
	c := startCluster(t, clusterConfig{name: "hooked", etcd: e.Endpoint, reconciler: "lease",
		advertise: advertise})
	for _, ns := range []string{fillNS, benchNS} {
		mustCreateNamespace(t, c.Admin, ns)
	}
	s := &createSide{name: "kube-apiserver with allocd's webhook", c: c, profiles: map[string]string{}}
	var pprof []string
	for range numbersAllocdReplicas {
		pprof = append(pprof, fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	}
	side := startAllocdEach(t, e.Endpoint, numbersAllocdReplicas, func(i int) []string {
		return []string{"--pprof-address=" + pprof[i]}
	})
	applyBridgeRBAC(t, c.Admin, "bridge-user")
	side.startBridge(t, c, c.pki.kubeconfig(t, "bridge", c.URL, pkix.Name{CommonName: "bridge-user"}),
		"--profiling")
	fail := admissionregistrationv1.Fail
	hooks := startWebhooks(t, c, side, webhookConfig{replicas: 2, failurePolicy: fail})
	s.webhook = hooks.Config.Webhooks[0].Name
	s.procs = append([]*proc{c.APIServer}, side.Replicas...)
	s.procs = append(append(s.procs, hooks.Replicas...), side.Bridge)
	for _, h := range hooks.Health {
		s.metrics = append(s.metrics, "http://"+h+"/metrics")
	}
	for _, m := range side.Metrics {
		s.metrics = append(s.metrics, "http://"+m+"/metrics")
	}
	for i, p := range pprof {
		s.profiles[fmt.Sprintf("allocd-%d", i)] = "http://" + p + "/debug/pprof/profile"
	}
	s.profiles["allocd-bridge"] = "http://" + side.bridgeHealth + "/debug/pprof/profile"
	s.settle = func(t *testing.T) { settleNamespace(t, side, benchNS) }
	return s
}

// settleNamespace waits until allocd holds nothing for an owner of namespace ns (the
// bridge has released what the deleted Services held, and nothing provisional is left).
func settleNamespace(t *testing.T, side *allocdSide, ns string) {
	t.Helper()
	var left int
	etcdtest.WaitFor(t, agreeLimit, "allocd releasing the deleted Services of "+ns, func() bool {
		al, err := allocdHolds(context.Background(), side.Client)
		if err != nil {
			return false
		}
		left = 0
		for _, a := range al {
			if a.GetOwner().GetNamespace() == ns {
				left++
			}
		}
		return left == 0
	})
}
