package client_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

type emptyLister struct{}

func (emptyLister) ListServices() ([]*allocdv1.Service, int64, error) { return nil, 1, nil }
func (emptyLister) ListPods() ([]*allocdv1.Pod, int64, error)         { return nil, 1, nil }
func (emptyLister) ListNodes() ([]*allocdv1.Node, int64, error)       { return nil, 1, nil }

// TestFeederPushTimeout: a replica that accepts the connection and never answers
// (cut off, hung) makes each push fail after the push timeout instead of holding the
// Feeder forever.
func TestFeederPushTimeout(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	c, err := client.New(l.Addr().String(), client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	errs := make(chan error, 10)
	f := client.NewFeeder(c, emptyLister{}, client.WithPushTimeout(200*time.Millisecond),
		client.WithFeedErrors(func(err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	select {
	case err := <-errs:
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, client.ErrUnavailable) {
			t.Logf("first push error: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no push failed within 2 s (push timeout 200 ms) against a replica that never answers")
	}
	cancel()
	<-done
}
