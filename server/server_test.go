package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// panicService is a one-method service whose handler panics.
var panicService = grpc.ServiceDesc{
	ServiceName: "test.Panic",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Boom",
		Handler: func(srv any, ctx context.Context, dec func(any) error,
			icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) { panic("boom") }
			if icpt == nil {
				return h(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/test.Panic/Boom"}, h)
		},
	}},
}

func TestPanicBecomesInternalAndServerLives(t *testing.T) {
	var logs syncBuffer
	gs, hs := NewGRPCServer(Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	gs.RegisterService(&panicService, struct{}{})
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := 0; i < 2; i++ {
		err := conn.Invoke(ctx, "/test.Panic/Boom", &emptypb.Empty{}, &emptypb.Empty{})
		if status.Code(err) != codes.Internal {
			t.Fatalf("Boom() = %v; want INTERNAL", err)
		}
	}
	if !strings.Contains(logs.String(), "panic") || !strings.Contains(logs.String(), "server_test.go") {
		t.Errorf("log = %q; want the panic with its stack", logs.String())
	}
	if r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil ||
		r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Health.Check after panics = %v, %v; want SERVING", r.GetStatus(), err)
	}
}

func TestStatus(t *testing.T) {
	inv := Invalid("owner.uid", "required")
	wrapped := fmt.Errorf("allocate: %w", inv)
	for _, tc := range []struct {
		name  string
		err   error
		wcode codes.Code
	}{
		{"nil", nil, codes.OK},
		{"invalid", inv, codes.InvalidArgument},
		{"wrapped invalid", wrapped, codes.InvalidArgument},
		{"canceled", fmt.Errorf("x: %w", context.Canceled), codes.Canceled},
		{"deadline", context.DeadlineExceeded, codes.DeadlineExceeded},
		{"unavailable", fmt.Errorf("load: %w", ErrUnavailable), codes.Unavailable},
		{"etcd unreachable", fmt.Errorf("txn: %w", status.Error(codes.Unavailable, "no leader")),
			codes.Unavailable},
		{"etcd timeout", fmt.Errorf("txn: %w", rpctypes.ErrTimeout), codes.Unavailable},
		{"etcd no leader", fmt.Errorf("txn: %w", rpctypes.ErrNoLeader), codes.Unavailable},
		{"etcd compacted during a list", fmt.Errorf("list allocations: %w", rpctypes.ErrCompacted),
			codes.Unavailable},
		{"etcd leader changed", rpctypes.ErrLeaderChanged, codes.Unavailable},
		{"etcd too many requests", rpctypes.ErrTooManyRequests, codes.Unavailable},
		{"etcd request too large", rpctypes.ErrRequestTooLarge, codes.Internal},
		{"etcd out of space", fmt.Errorf("allocation transaction: %w", rpctypes.ErrNoSpace),
			codes.ResourceExhausted},
		{"status kept", status.Error(codes.NotFound, "gone"), codes.NotFound},
		{"etcd connection broken", fmt.Errorf("read owner record: %w",
			status.Error(codes.Internal,
				"stream terminated by RST_STREAM with error code: PROTOCOL_ERROR")), codes.Unavailable},
		{"etcd response cut", fmt.Errorf("read owner record: %w",
			status.Error(codes.Internal,
				"server closed the stream without sending trailers")), codes.Unavailable},
		{"unknown", errors.New("disk on fire"), codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(Status(tc.err)); got != tc.wcode {
				t.Errorf("Status(%v) code = %v; want %v", tc.err, got, tc.wcode)
			}
		})
	}
	st := status.Convert(Status(wrapped))
	var br *errdetails.BadRequest
	for _, d := range st.Details() {
		if b, ok := d.(*errdetails.BadRequest); ok {
			br = b
		}
	}
	if br == nil || len(br.FieldViolations) != 1 || br.FieldViolations[0].Field != "owner.uid" {
		t.Errorf("Status(%v) details = %v; want BadRequest naming owner.uid", wrapped, st.Details())
	}
	for _, err := range []error{rpctypes.ErrTimeout, status.Error(codes.Unavailable, "leader unreachable")} {
		var ri *errdetails.RetryInfo
		for _, d := range status.Convert(Status(err)).Details() {
			if r, ok := d.(*errdetails.RetryInfo); ok {
				ri = r
			}
		}
		if ri == nil {
			t.Errorf("Status(%v) has no RetryInfo", err)
		}
	}
	if (&InvalidError{}).OrNil() != nil {
		t.Errorf("empty InvalidError.OrNil() != nil")
	}
}
