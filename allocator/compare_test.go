package allocator

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// TestCompares checks the transaction's compares against clientv3.Compare's.
func TestCompares(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want clientv3.Cmp
	}{
		{"createdAt(k, 0)", createdAt("/allocd/clusterips/10.0.0.1", 0),
			clientv3.Compare(clientv3.CreateRevision("/allocd/clusterips/10.0.0.1"), "=", 0)},
		{"createdAt(k, 42)", createdAt("/allocd/epoch", 42),
			clientv3.Compare(clientv3.CreateRevision("/allocd/epoch"), "=", 42)},
		{"modifiedAt(k, 7)", modifiedAt("/allocd/owners/u", 7),
			clientv3.Compare(clientv3.ModRevision("/allocd/owners/u"), "=", 7)},
		{"versionBelow(k, 12)", versionBelow("/allocd/epoch", 12),
			clientv3.Compare(clientv3.Version("/allocd/epoch"), "<", 12)},
	} {
		if got, want := c.got.GetCompare(), c.want.GetCompare(); !proto.Equal(got, want) {
			t.Errorf("%s = %v; want %v", c.name, got, want)
		}
	}
}
