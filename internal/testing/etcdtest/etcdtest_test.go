package etcdtest

import (
	"context"
	"testing"
	"time"
)

func TestRestartKeepsData(t *testing.T) {
	e := New(t, WithFsync())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.Client.Put(ctx, "/k", "v"); err != nil {
		t.Fatalf("Put: %v", err)
	}
	e.Restart()
	resp, err := e.Client.Get(ctx, "/k")
	if err != nil {
		t.Fatalf("Get after restart: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("Get(/k) after restart = %v; want v", resp.Kvs)
	}
}
