package leader

import (
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestCandidates: the view names the key with the lowest CreateRevision; it is unknown
// before a listing and after forget; a listing read outside the watch replaces it only
// when newer, and the watch's events it already holds are skipped, while the events of
// one transaction (one revision) all apply.
func TestCandidates(t *testing.T) {
	listing := func(rev int64, kvs ...*mvccpb.KeyValue) *clientv3.GetResponse {
		return &clientv3.GetResponse{Header: &etcdserverpb.ResponseHeader{Revision: rev}, Kvs: kvs}
	}
	kv := func(key string, create, mod int64, value string) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte(key), CreateRevision: create, ModRevision: mod,
			Value: []byte(value)}
	}
	put := func(key string, create, mod int64, value string) *clientv3.Event {
		return &clientv3.Event{Type: mvccpb.PUT, Kv: kv(key, create, mod, value)}
	}
	del := func(key string, mod int64) *clientv3.Event {
		return &clientv3.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: mod}}
	}
	var c candidates
	steps := []struct {
		what string
		do   func()
		want string // "" for unknown
	}{
		{"nothing listed", func() {}, ""},
		{"an event before a listing", func() { c.apply([]*clientv3.Event{put("k9", 3, 3, "z")}) }, ""},
		{"a read before a listing", func() { c.merge(listing(4, kv("k9", 3, 3, "z"))) }, ""},
		{"listed", func() { c.reset(listing(10, kv("k2", 7, 7, "b"), kv("k1", 5, 9, "a"))) }, "a"},
		{"the leader deleted", func() { c.apply([]*clientv3.Event{del("k1", 11)}) }, "b"},
		{"a later candidate", func() { c.apply([]*clientv3.Event{put("k3", 12, 12, "c")}) }, "b"},
		{"the leader proclaims", func() { c.apply([]*clientv3.Event{put("k2", 7, 13, "b2")}) }, "b2"},
		{"an older read", func() { c.merge(listing(9, kv("k1", 5, 9, "a"))) }, "b2"},
		{"a newer read", func() { c.merge(listing(20, kv("k3", 12, 12, "c"))) }, "c"},
		{"an event the read holds", func() { c.apply([]*clientv3.Event{put("k2", 7, 14, "b3")}) }, "c"},
		{"one transaction", func() {
			c.apply([]*clientv3.Event{put("k4", 21, 21, "d"), del("k3", 21)})
		}, "d"},
		{"forgotten", func() { c.forget() }, ""},
		{"an event while forgotten", func() { c.apply([]*clientv3.Event{put("k5", 30, 30, "e")}) }, ""},
		{"a read while forgotten", func() { c.merge(listing(31, kv("k5", 30, 30, "e"))) }, ""},
		{"listed, no candidate", func() { c.reset(listing(32)) }, ""},
		{"a candidate", func() { c.apply([]*clientv3.Event{put("k6", 33, 33, "f")}) }, "f"},
	}
	for _, s := range steps {
		s.do()
		got, ok := c.leader()
		if got != s.want || ok != (s.want != "") {
			t.Errorf("after %s: leader() = %q, %v; want %q, %v", s.what, got, ok, s.want, s.want != "")
		}
	}
}
