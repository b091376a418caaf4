package client_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// webLister holds the Service ns/web (selector app=web) and no Pod.
type webLister struct{}

func (webLister) ListServices() ([]*allocdv1.Service, int64, error) {
	return []*allocdv1.Service{{Namespace: "ns", Name: "web", Uid: "uid-web", Type: "ClusterIP",
		IpFamilies: []string{"IPv4"},
		Selector:   &allocdv1.Selector{MatchLabels: map[string]string{"app": "web"}},
		Ports:      []*allocdv1.ServicePortSpec{{Name: "http", Port: 80, Protocol: "TCP"}}}}, 1, nil
}
func (webLister) ListPods() ([]*allocdv1.Pod, int64, error)   { return nil, 1, nil }
func (webLister) ListNodes() ([]*allocdv1.Node, int64, error) { return nil, 1, nil }

func webPod(name, ip string) *allocdv1.Pod {
	return &allocdv1.Pod{Namespace: "ns", Name: name, Uid: "uid-" + name,
		Labels: map[string]string{"app": "web"}, NodeName: "n1", Phase: "Running", Ready: true,
		PodIps: []string{ip}, Containers: []*allocdv1.Container{{Name: "c"}}}
}

// TestFeederDropsOnlyTheInvalidEvent: a batch holding one event allocd refuses (a
// trafficDistribution it does not know) still delivers the batch's other events; the
// refused one is reported.
func TestFeederDropsOnlyTheInvalidEvent(t *testing.T) {
	d := daemon.StartForTest(t)
	c := newClient(t, d.GRPCAddr())
	ctx, cancel := context.WithCancel(etcdtest.Context(t))
	errs := make(chan error, 100)
	f := client.NewFeeder(c, webLister{}, client.WithFlushInterval(300*time.Millisecond),
		client.WithFeedErrors(func(err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	addrs := func() []string {
		ep, err := c.GetServiceEndpoints(ctx, "ns", "web")
		if err != nil {
			return nil
		}
		var out []string
		for _, s := range ep.GetSubsets() {
			for _, a := range s.GetAddresses() {
				out = append(out, a.GetIp())
			}
		}
		slices.Sort(out)
		return out
	}
	waitUntil(t, "allocd's Endpoints of ns/web", func() bool {
		_, err := c.GetServiceEndpoints(ctx, "ns", "web")
		return err == nil
	})
	// One batch: the flush interval holds them together.
	f.UpsertPod(webPod("p1", "10.0.0.1"), 10)
	f.UpsertService(&allocdv1.Service{Namespace: "ns", Name: "bad", Uid: "uid-bad", Type: "ClusterIP",
		TrafficDistribution: "Bogus"}, 11)
	f.UpsertPod(webPod("p2", "10.0.0.2"), 12)
	waitUntil(t, "both Pods in ns/web's Endpoints", func() bool {
		return slices.Equal(addrs(), []string{"10.0.0.1", "10.0.0.2"})
	})
	var reported bool
	for len(errs) > 0 {
		if err := <-errs; errors.Is(err, client.ErrInvalid) {
			reported = true
		}
	}
	if !reported {
		t.Errorf("no ErrInvalid told to WithFeedErrors' function; want the dropped event reported")
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
