package kube

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/allocd/allocd/client"
)

// allocdSide is allocd (two replicas on the shared etcd, under their own prefix) and
// the bridge between it and one cluster.
type allocdSide struct {
	t        testing.TB
	Replicas []*proc
	Addrs    []string
	// Metrics are the replicas' metrics addresses.
	Metrics      []string
	Bridge       *proc
	Client       *client.Client
	bridgeHealth string
	bridgeArgs   []string
}

// startAllocd starts n allocd replicas on etcd, with the cluster's ranges.
func startAllocd(t testing.TB, etcd string, n int, extra ...string) *allocdSide {
	t.Helper()
	return startAllocdEach(t, etcd, n, func(int) []string { return extra })
}

// startAllocdEach is startAllocd with the extra arguments of each replica its own
// (replica i's are each(i)).
func startAllocdEach(t testing.TB, etcd string, n int, each func(i int) []string) *allocdSide {
	t.Helper()
	s := &allocdSide{t: t}
	for i := range n {
		grpc := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		args := append([]string{
			"--etcd-servers=" + etcd,
			"--etcd-prefix=/allocd",
			"--etcd-compaction-interval=0",
			"--service-cluster-ip-range=" + serviceCIDRs,
			"--service-node-port-range=" + nodePortRange,
			"--grpc-address=" + grpc,
			"--metrics-address=" + metrics,
			"--repair-interval=10s",
		}, each(i)...)
		p := startProc(t, fmt.Sprintf("allocd-%d", i), binary(t, "allocd"), args...)
		waitHTTP(t, p, "http://"+metrics+"/metrics", "", time.Minute)
		s.Replicas = append(s.Replicas, p)
		s.Addrs = append(s.Addrs, grpc)
		s.Metrics = append(s.Metrics, metrics)
	}
	c, err := client.New("dns:///" + s.Addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s.Client = c
	return s
}

// target is a gRPC target reaching every replica (the bridge follows the one that
// answers).
func (s *allocdSide) target() string {
	return strings.Join(s.Addrs, ",")
}

// startBridge starts the bridge for cluster c with kubeconfig.
func (s *allocdSide) startBridge(t testing.TB, c *cluster, kubeconfig string, extra ...string) {
	t.Helper()
	s.bridgeHealth = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s.bridgeArgs = append([]string{
		"--kubeconfig=" + kubeconfig,
		"--allocd-address=" + s.target(),
		"--health-address=" + s.bridgeHealth,
	}, extra...)
	s.Bridge = startProc(t, "allocd-bridge", binary(t, "allocd-bridge"), s.bridgeArgs...)
	s.WaitBridgeReady(t)
}

// WaitBridgeReady waits for the bridge's /readyz.
func (s *allocdSide) WaitBridgeReady(t testing.TB) {
	t.Helper()
	waitHTTP(t, s.Bridge, "http://"+s.bridgeHealth+"/readyz", "", 2*time.Minute)
}
