package client_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/testing/leakcheck"
)

// examples holds what the examples started, stopped by TestMain once they ran.
var examples struct {
	mu    sync.Mutex
	stops []func()
}

// startAllocd starts an allocd with embedded etcd for an example (which cannot take a
// testing.T) and returns its gRPC address. It panics if allocd does not start: an
// example then fails with the panic.
func startAllocd() string {
	dir, err := os.MkdirTemp("", "allocd-example-")
	if err != nil {
		panic(err)
	}
	free := func() string {
		a, err := daemon.FreeAddr()
		if err != nil {
			panic(err)
		}
		return a
	}
	cfg := daemon.TestConfig(dir, free)
	cfg.ServiceClusterIPRange = "10.96.0.0/24"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := daemon.Start(ctx, cfg)
	if err != nil {
		os.RemoveAll(dir)
		panic(fmt.Sprintf("start allocd: %v", err))
	}
	examples.mu.Lock()
	defer examples.mu.Unlock()
	examples.stops = append(examples.stops, func() { d.Close(); os.RemoveAll(dir) })
	return d.GRPCAddr()
}

func TestMain(m *testing.M) {
	leakcheck.MustTestMain(m, func() {
		for _, stop := range examples.stops {
			stop()
		}
	})
}
