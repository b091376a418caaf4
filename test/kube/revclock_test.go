package kube

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// revClock says when each etcd revision under a cluster's prefix was committed: the
// time a watch on etcd itself (not through the API server) showed it. An object's
// resourceVersion is the etcd revision that wrote it, so the clock times a write in
// the API (a flip, a slice) without the API server's watch to the test, or the
// test's own decoding, in between: under load those lag by seconds, and by as much on
// both sides.
type revClock struct {
	mu sync.Mutex
	at map[int64]time.Time
}

// startRevClock watches prefix from now on until ctx ends (done then closes); it
// returns once the watch is established.
func startRevClock(ctx context.Context, cli *clientv3.Client, prefix string) (*revClock, <-chan struct{}, error) {
	rc := &revClock{at: map[int64]time.Time{}}
	wch := cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	select {
	case resp, ok := <-wch:
		if !ok || resp.Err() != nil || !resp.Created {
			return nil, nil, fmt.Errorf("etcd watch of %s: not created (%v)", prefix, resp.Err())
		}
	case <-time.After(30 * time.Second):
		return nil, nil, fmt.Errorf("etcd watch of %s: not created within 30 s", prefix)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for resp := range wch {
			now := time.Now()
			rc.mu.Lock()
			for _, ev := range resp.Events {
				if _, ok := rc.at[ev.Kv.ModRevision]; !ok {
					rc.at[ev.Kv.ModRevision] = now
				}
			}
			rc.mu.Unlock()
		}
	}()
	return rc, done, nil
}

// when is the time revision rv (a resourceVersion) was committed; ok is false when
// the clock did not see it.
func (rc *revClock) when(rv string) (time.Time, bool) {
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	t, ok := rc.at[n]
	return t, ok
}
