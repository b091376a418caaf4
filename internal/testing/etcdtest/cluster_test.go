package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestClusterLeaderCrash crashes the leader of a three-member cluster: another member
// leads, the client carries on with the two left, and the crashed member comes back
// with the data written meanwhile.
func TestClusterLeaderCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault run: the leader of three members crashes")
	}
	c := NewCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Client.Put(ctx, "/k", "1"); err != nil {
		t.Fatalf("Put(/k, 1) = %v", err)
	}
	old := c.Leader()
	c.StopMember(old)
	if now := c.Leader(); now == old {
		t.Fatalf("Leader() = %d after StopMember(%d); want another member", now, old)
	}
	if _, err := c.Client.Put(ctx, "/k", "2"); err != nil {
		t.Fatalf("Put(/k, 2) with the leader down = %v", err)
	}
	c.StartMember(old)
	// The member that was down serves the write it missed.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Endpoints[old]},
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("client of m%d: %v", old, err)
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, "/k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "2" {
		t.Fatalf("Get(/k) from m%d after its restart = %v, %v; want 2", old, resp, err)
	}
}
