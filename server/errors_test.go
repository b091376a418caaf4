package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestStatusOfResetStream: a peer that resets a call's stream (an HTTP/2 server whose
// handler aborts: RST_STREAM INTERNAL_ERROR, as a connection to etcd that breaks
// mid-call) fails the call INTERNAL in grpc-go's client, and Status turns it into
// UNAVAILABLE: its outcome is unknown, and a retry may succeed.
func TestStatusOfResetStream(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true) // gRPC's plaintext HTTP/2, with prior knowledge
	srv := &http.Server{
		Handler:   http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }),
		Protocols: &protocols,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve() = %v; want %v", err, http.ErrServerClosed)
		}
	})

	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if got := status.Code(err); got != codes.Internal {
		t.Fatalf("Check() against a peer that resets the stream = %v; want INTERNAL from grpc-go", err)
	}
	wrapped := fmt.Errorf("read owner record: %w", err)
	if got := status.Code(Status(wrapped)); got != codes.Unavailable {
		t.Errorf("Status(%v) code = %v; want %v", wrapped, got, codes.Unavailable)
	}
}
