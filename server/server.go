package server

import (
	"context"
	"log/slog"
	"runtime/debug"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/tlsfiles"
)

// MaxRecvMsgSize bounds one request message. A Service snapshot of 100k Services fits
// in one message of about 7 MiB; larger ones are streamed in chunks.
const MaxRecvMsgSize = 16 << 20

// Options configures NewGRPCServer.
type Options struct {
	// Logger receives panics with their stacks, failed calls that end INTERNAL or
	// UNKNOWN, and, when it is enabled at debug level, one line per call.
	Logger *slog.Logger
	// Registerer receives the gRPC server metrics (grpc_server_handled_total and the
	// handling-time histogram). Nil means no metrics.
	Registerer prometheus.Registerer
	// ServerOptions come before the ones NewGRPCServer sets (TLS credentials, say):
	// their interceptors run outermost.
	ServerOptions []grpc.ServerOption
}

// NewGRPCServer returns a gRPC server with allocd's interceptors (Prometheus metrics,
// logging, panic recovery), the grpc.health.v1 service (NOT_SERVING until the caller
// says otherwise) and server reflection v1 and v1alpha, so that grpcurl works without
// proto files. The caller registers the allocd services on it and serves it.
func NewGRPCServer(o Options) (*grpc.Server, *health.Server) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var unary []grpc.UnaryServerInterceptor
	var stream []grpc.StreamServerInterceptor
	var metrics *grpcMetrics
	if o.Registerer != nil {
		metrics = newGRPCMetrics()
		o.Registerer.MustRegister(metrics)
		unary = append(unary, metrics.unary())
		stream = append(stream, metrics.stream())
	}
	// Per-call lines only when debug is on: the logging interceptor builds its fields on
	// every call, which would cost throughput for lines nobody reads.
	if log.Enabled(context.Background(), slog.LevelDebug) {
		l := logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
			log.Log(ctx, slog.LevelDebug, msg, fields...)
		})
		opts := []logging.Option{logging.WithLogOnEvents(logging.FinishCall),
			logging.WithFieldsFromContext(
				func(ctx context.Context) logging.Fields { return callerFields(ctx) })}
		unary = append(unary, logging.UnaryServerInterceptor(l, opts...))
		stream = append(stream, logging.StreamServerInterceptor(l, opts...))
	} else {
		unary = append(unary, logFailures(log))
	}
	rec := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in gRPC handler", "panic", p, "stack", string(debug.Stack()))
		return status.Errorf(codes.Internal, "internal error: %v", p)
	})
	unary = append(unary, recovery.UnaryServerInterceptor(rec))
	stream = append(stream, recovery.StreamServerInterceptor(rec))

	// The caller's options first: their interceptors (authorization, which also drops
	// forwarding metadata that a caller other than a replica sent) run outermost, so
	// that the logs below see the call as it is honoured.
	opts := append(append([]grpc.ServerOption(nil), o.ServerOptions...),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
		grpc.MaxRecvMsgSize(MaxRecvMsgSize))
	gs := grpc.NewServer(opts...)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	if err := registerReflection(gs); err != nil {
		// The embedded descriptors are built with the binary; failing to read them is
		// a build defect. Serve reflection without the comments rather than none.
		log.Error("documented reflection unavailable", "err", err)
		reflection.Register(gs)
	}
	if metrics != nil {
		// Zero-valued series for what is registered so far, so /metrics shows the
		// gRPC metrics before the first call.
		metrics.initialize(gs)
	}
	return gs, hs
}

// logFailures logs calls that end INTERNAL or UNKNOWN: the caller sees only a status,
// the operator needs the cause. Everything else is the caller's business.
func logFailures(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo,
		handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			if c := status.Code(err); c == codes.Internal || c == codes.Unknown {
				log.ErrorContext(ctx, "call failed",
					append([]any{"method", info.FullMethod, "code", c.String(), "err", err},
						callerFields(ctx)...)...)
			}
		}
		return resp, err
	}
}

// callerFields name the caller of a call in its log lines: its client certificate's
// identity, or, for a call a replica forwarded, the replica and the original caller's
// identity.
func callerFields(ctx context.Context) []any {
	if replica, caller, ok := ForwardedFor(ctx); ok {
		return []any{"identity", caller, "forwarded_by", replica}
	}
	if id := tlsfiles.PeerIdentity(ctx); id != "" {
		return []any{"identity", id}
	}
	return nil
}
