package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// TestCluster is the topology of docker-compose.yml and `make cluster`: one etcd (the
// embedded one of the first replica) and two allocd replicas sharing it, driven through
// client/. Both replicas exhaust a /28 concurrently: exactly the usable addresses are
// handed out, none twice, and the rest are refused as full.
func TestCluster(t *testing.T) {
	const cidr = "10.96.0.0/28" // 14 usable addresses, the first reserved for kubernetes
	one := StartForTest(t, func(c *Config) { c.ServiceClusterIPRange = cidr })
	two := StartForTest(t, func(c *Config) {
		c.ServiceClusterIPRange = cidr
		c.EtcdServers = []string{"http://" + one.cfg.EmbeddedEtcdClientAddress}
	})
	var clients []*client.Client
	for _, d := range []*Daemon{one, two} {
		c, err := client.New(d.GRPCAddr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var (
		mu      sync.Mutex
		holders = map[string]string{}
		full    int
		wg      sync.WaitGroup
	)
	for i := range 40 {
		wg.Go(func() {
			uid := fmt.Sprintf("uid-%d", i)
			res, err := clients[i%2].Allocate(ctx, &allocdv1.AllocateRequest{
				Owner: &allocdv1.Owner{Namespace: "default", Name: uid, Uid: uid},
			})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, client.ErrFull):
				full++
			case err != nil:
				t.Errorf("Allocate(%s) = %v; want an address or ErrFull", uid, err)
			default:
				for _, ip := range res.GetClusterIps() {
					if h, dup := holders[ip]; dup {
						t.Errorf("%s handed out twice: to %s and %s", ip, h, uid)
					}
					holders[ip] = uid
				}
			}
		})
	}
	wg.Wait()
	if len(holders) != 13 || full != 27 {
		t.Errorf("granted %d, full %d; want 13 granted and 27 refused as full", len(holders), full)
	}
	// What one replica allocated, the other sees, with its holder.
	for ip, uid := range holders {
		for i, c := range clients {
			a, err := c.GetAllocation(ctx, &allocdv1.GetAllocationRequest{
				Target: &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: ip}})
			if err != nil || a.GetOwner().GetUid() != uid {
				t.Errorf("replica %d: GetAllocation(%s) = %v, %v; want held by %s", i+1, ip, a.GetOwner(),
					err, uid)
			}
		}
	}
}
