package allocator

import (
	"context"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestLargestRangesMemoryBounded: the largest ranges allowed, an IPv4 /8 and an IPv6
// /104 (2^24 addresses each, where Kubernetes stops at 2^20 for IPv4 and uses only 65,536
// addresses of an IPv6 range), cost their bitsets and nothing that grows with the range
// size, and allocate from the far end of the range.
func TestLargestRangesMemoryBounded(t *testing.T) {
	e := etcdtest.New(t)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	a := start(t, e.Client, testConfig("10.0.0.0/8", "fd00::/104"))
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	// Two bitsets (used, pending) of 2 MiB per range: 8 MiB. Allow for the etcd member,
	// the client and the rest, but not for anything per address (which would be
	// hundreds of MiB for 2^25 addresses).
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if grown > 48<<20 {
		t.Errorf("heap grew by %d MiB for a /8 and a /104; want < 48 MiB", grown>>20)
	}
	t.Logf("heap grew by %.1f MiB", float64(grown)/(1<<20))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, s := range []string{"10.255.255.254", "fd00::ff:ffff"} {
		want := netip.MustParseAddr(s)
		res, err := a.Allocate(ctx,
			Request{Owner: Owner{Namespace: "ns", Name: s, UID: "uid-" + s}, ClusterIPs: []netip.Addr{want}})
		if err != nil || len(res.ClusterIPs) != 1 || res.ClusterIPs[0] != want {
			t.Errorf("Allocate(%s) = %v, %v; want it", want, res.ClusterIPs, err)
		}
	}
	for _, r := range a.Ranges() {
		if r.Kind == KindClusterIP && r.Size != 1<<24-2 && r.Size != 1<<24-1 {
			t.Errorf("range %s size %d; want 2^24 - 2 (IPv4) or 2^24 - 1 (IPv6)", r.Name, r.Size)
		}
	}
}
