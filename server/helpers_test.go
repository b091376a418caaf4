package server_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allocd/allocd/server"
)

// serve runs loop (a service's Run) until the test ends, serves the services that
// register adds on a loopback port with the production interceptors, and returns a
// connection to it. Everything stops by t.Cleanup; loop must return nil when its
// context ends.
func serve(t *testing.T, loop func(context.Context) error, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- loop(ctx) }()
	gs, _ := server.NewGRPCServer(server.Options{})
	register(gs)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(l) }()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		cancel()
		if err := <-runDone; err != nil {
			t.Errorf("Run() = %v", err)
		}
	})
	return conn
}
