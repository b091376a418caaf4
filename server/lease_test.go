package server_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/internal/testing/etcdtest"
	"github.com/allocd/allocd/masterlease"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/server"
)

const leasePrefix = "/allocd/masterleases/"

// startLeaseServer serves a LeaseService over a running Manager on a loopback port
// and returns a client of it; everything stops by t.Cleanup.
func startLeaseServer(t *testing.T, e *etcdtest.Server) allocdv1.LeaseServiceClient {
	t.Helper()
	m, err := masterlease.New(context.Background(), e.Client, masterlease.Config{
		Prefix: leasePrefix, DefaultTTL: 2 * time.Second, ServicePort: 6443,
	})
	if err != nil {
		t.Fatalf("masterlease.New() = %v", err)
	}
	conn := serve(t, m.Run, func(gs *grpc.Server) {
		allocdv1.RegisterLeaseServiceServer(gs, server.NewLeaseService(m, nil))
	})
	return allocdv1.NewLeaseServiceClient(conn)
}

func TestLeaseServiceBadInput(t *testing.T) {
	e := etcdtest.New(t)
	c := startLeaseServer(t, e)
	ctx := etcdtest.Context(t)
	before, err := e.Client.Get(ctx, "rev")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		ip     string
		ttl    int64
		fields []string
	}{
		{"not-an-ip", 0, []string{"ip"}},
		{"0.0.0.0", 0, []string{"ip"}},
		{"::", 0, []string{"ip"}},
		{"224.0.0.1", 0, []string{"ip"}},
		{"ff02::1", 0, []string{"ip"}},
		{"fe80::1%eth0", 15, []string{"ip"}},
		{"10.0.0.1", -1, []string{"ttl_seconds"}},
		{"10.0.0.1", 3601, []string{"ttl_seconds"}},
		{"not-an-ip", 100000, []string{"ip", "ttl_seconds"}},
	}
	for _, tt := range tests {
		resp, err := c.Renew(ctx, &allocdv1.RenewRequest{Ip: tt.ip, TtlSeconds: tt.ttl})
		if got := badRequestFields(t, err); status.Code(err) != codes.InvalidArgument ||
			!slices.Equal(got, tt.fields) {
			t.Errorf("Renew(%q, %d) = %v, %v (fields %v); want INVALID_ARGUMENT with BadRequest on %v",
				tt.ip, tt.ttl, resp, err, got, tt.fields)
		}
	}
	for _, ip := range []string{"not-an-ip", "0.0.0.0", "224.0.0.1", ""} {
		resp, err := c.RemoveLease(ctx, &allocdv1.RemoveLeaseRequest{Ip: ip, Shutdown: true})
		if got := badRequestFields(t, err); status.Code(err) != codes.InvalidArgument ||
			!slices.Equal(got, []string{"ip"}) {
			t.Errorf("RemoveLease(%q) = %v, %v; want INVALID_ARGUMENT with BadRequest on ip", ip, resp, err)
		}
	}
	after, err := e.Client.Get(ctx, "rev")
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != before.Header.Revision {
		t.Errorf("etcd revision %d after bad requests; want %d (nothing written)", after.Header.Revision,
			before.Header.Revision)
	}
	if r, err := e.Client.Leases(ctx); err != nil || len(r.Leases) != 0 {
		t.Errorf("etcd leases after bad requests = %v, %v; want none", r, err)
	}
}

// badRequestFields returns the fields of err's BadRequest detail.
func badRequestFields(t *testing.T, err error) []string {
	t.Helper()
	var fields []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	return fields
}

// TestLeaseServiceAcceptance walks the acceptance over gRPC: two leases, list
// and endpoints; one not renewed leaves ListLeases and a running WatchEndpoints within
// TTL + 2 s; RemoveLease of the other: gone at once, endpoints kept by the guard; a
// shutdown removal of the last lease empties them.
func TestLeaseServiceAcceptance(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out real lease TTLs: seconds")
	}
	e := etcdtest.New(t)
	c := startLeaseServer(t, e)
	ctx := etcdtest.Context(t)

	live, err := c.Renew(ctx, &allocdv1.RenewRequest{Ip: "192.168.1.20", TtlSeconds: 30})
	if err != nil {
		t.Fatalf("Renew(live) = %v", err)
	}
	if l := live.GetLease(); l.GetIp() != "192.168.1.20" || l.GetLeaseId() == 0 || l.GetTtlSeconds() != 30 ||
		l.GetRevision() == 0 {
		t.Errorf("Renew(live) = %v; want ip, a lease id, ttl 30 and a revision", l)
	}
	// 2 s, not 1: on a loaded machine a 1 s lease may already be at its end when
	// ListLeases reads it, and then it is live with no time left.
	dead, err := c.Renew(ctx, &allocdv1.RenewRequest{Ip: "192.168.1.3", TtlSeconds: 2})
	if err != nil {
		t.Fatalf("Renew(dead) = %v", err)
	}
	acked := time.Now()

	list, err := c.ListLeases(ctx, &allocdv1.ListLeasesRequest{})
	if err != nil {
		t.Fatalf("ListLeases() = %v", err)
	}
	if got := leaseIPs(list); !slices.Equal(got, []string{"192.168.1.3", "192.168.1.20"}) {
		t.Errorf("ListLeases() = %v; want [192.168.1.3 192.168.1.20] (address order)", got)
	}
	for _, l := range list.GetLeases() {
		if r := l.GetRemainingTtlSeconds(); r <= 0 || r > l.GetTtlSeconds() {
			t.Errorf("ListLeases() lease %v: remaining %d; want in (0, %d]", l.GetIp(), r, l.GetTtlSeconds())
		}
	}
	if list.GetLeases()[0].GetLeaseId() != dead.GetLease().GetLeaseId() {
		t.Errorf("ListLeases() lease id of %s = %d; want %d", list.GetLeases()[0].GetIp(),
			list.GetLeases()[0].GetLeaseId(), dead.GetLease().GetLeaseId())
	}

	eps, err := c.GetEndpoints(ctx, &allocdv1.GetEndpointsRequest{})
	if err != nil {
		t.Fatalf("GetEndpoints() = %v", err)
	}
	checkEndpoints(t, "GetEndpoints()", eps.GetEndpoints(), "192.168.1.3", "192.168.1.20")

	stream, err := c.WatchEndpoints(ctx, &allocdv1.WatchEndpointsRequest{})
	if err != nil {
		t.Fatalf("WatchEndpoints() = %v", err)
	}
	msgs := make(chan *allocdv1.Endpoints, 10)
	go func() {
		defer close(msgs)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			msgs <- m.GetEndpoints()
		}
	}()
	next := func(what string) *allocdv1.Endpoints {
		t.Helper()
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatalf("%s: stream ended", what)
			}
			return m
		case <-time.After(6 * time.Second):
			t.Fatalf("%s: no message within 6s", what)
		}
		return nil
	}
	checkEndpoints(t, "first WatchEndpoints message", next("first"), "192.168.1.3", "192.168.1.20")
	checkEndpoints(t, "after the dead lease expired", next("expiry"), "192.168.1.20")
	if took := time.Since(acked); took > 4*time.Second {
		t.Errorf("dead lease left WatchEndpoints %v after its last Renew; want <= TTL + 2s = 4s", took)
	}
	list, err = c.ListLeases(ctx, &allocdv1.ListLeasesRequest{})
	if err != nil || !slices.Equal(leaseIPs(list), []string{"192.168.1.20"}) {
		t.Errorf("ListLeases() after expiry = %v, %v; want [192.168.1.20]", leaseIPs(list), err)
	}

	rm, err := c.RemoveLease(ctx, &allocdv1.RemoveLeaseRequest{Ip: "192.168.1.20"})
	if err != nil || !rm.GetRemoved() || rm.GetRevision() <= live.GetLease().GetRevision() {
		t.Errorf("RemoveLease(live) = %v, %v; want removed at a later revision", rm, err)
	}
	list, err = c.ListLeases(ctx, &allocdv1.ListLeasesRequest{})
	if err != nil || len(list.GetLeases()) != 0 {
		t.Errorf("ListLeases() after RemoveLease = %v, %v; want none", leaseIPs(list), err)
	}
	eps, err = c.GetEndpoints(ctx, &allocdv1.GetEndpointsRequest{})
	if err != nil {
		t.Fatalf("GetEndpoints() = %v", err)
	}
	checkEndpoints(t, "GetEndpoints() with no lease (guard)", eps.GetEndpoints(), "192.168.1.20")
	rm, err = c.RemoveLease(ctx, &allocdv1.RemoveLeaseRequest{Ip: "192.168.1.20"})
	if err != nil || rm.GetRemoved() {
		t.Errorf("RemoveLease(absent) = %v, %v; want removed false, no error", rm, err)
	}

	// The last API server shuts down cleanly: the endpoints become empty.
	if _, err := c.Renew(ctx, &allocdv1.RenewRequest{Ip: "fd00::1"}); err != nil {
		t.Fatalf("Renew(fd00::1) = %v", err)
	}
	checkEndpoints(t, "after Renew(fd00::1)", next("renew"), "fd00::1")
	if _, err := c.RemoveLease(ctx, &allocdv1.RemoveLeaseRequest{Ip: "fd00::1", Shutdown: true}); err != nil {
		t.Fatalf("RemoveLease(shutdown) = %v", err)
	}
	checkEndpoints(t, "after RemoveLease(shutdown)", next("shutdown"))
}

func leaseIPs(r *allocdv1.ListLeasesResponse) []string {
	var out []string
	for _, l := range r.GetLeases() {
		out = append(out, l.GetIp())
	}
	return out
}

func checkEndpoints(t *testing.T, what string, e *allocdv1.Endpoints, want ...string) {
	t.Helper()
	if e.GetNamespace() != "default" || e.GetName() != "kubernetes" || e.GetRevision() == 0 {
		t.Errorf("%s = %v; want default/kubernetes with a revision", what, e)
	}
	if len(want) == 0 {
		if len(e.GetSubsets()) != 0 {
			t.Errorf("%s subsets = %v; want none", what, e.GetSubsets())
		}
		return
	}
	if len(e.GetSubsets()) != 1 {
		t.Fatalf("%s subsets = %v; want one", what, e.GetSubsets())
	}
	s := e.GetSubsets()[0]
	if !slices.Equal(s.GetAddresses(), want) {
		t.Errorf("%s addresses = %v; want %v", what, s.GetAddresses(), want)
	}
	if p := s.GetPorts(); len(p) != 1 || p[0].GetName() != "https" || p[0].GetPort() != 6443 ||
		p[0].GetProtocol() != "TCP" {
		t.Errorf("%s ports = %v; want [https 6443 TCP]", what, p)
	}
}
