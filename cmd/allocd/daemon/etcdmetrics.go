package daemon

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// newEtcdRequestMetrics is the latency of allocd's unary etcd requests, registered on
// reg: what the allocator's commits, the lease renewals and the Endpoints writes wait
// for, apart from allocd's own work. Watches and lease keep-alives are streams and are
// not in it.
func newEtcdRequestMetrics(reg prometheus.Registerer) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "allocd_etcd_request_duration_seconds",
		Help: "Latency of unary etcd requests (each try: the etcd client retries some), by method (KV/Txn, " +
			"KV/Range, Lease/LeaseGrant, ...) and gRPC code.",
		// 0.25 ms to 4 s: a commit on a local disk takes about a millisecond, an
		// election a second or more.
		Buckets: prometheus.ExponentialBuckets(0.00025, 2, 15),
	}, []string{"method", "code"})
	reg.MustRegister(h)
	return h
}

// etcdRequestMetrics observes every try of a unary etcd request in h. It goes first in
// the etcd client's chain, so that it times what the interceptors after it wait for.
func etcdRequestMetrics(h *prometheus.HistogramVec) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		start := time.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		h.WithLabelValues(etcdMethod(method), status.Code(err).String()).Observe(time.Since(start).Seconds())
		return err
	}
}

// etcdMethod is the short name of a gRPC method of etcd: "/etcdserverpb.KV/Txn" is
// "KV/Txn".
func etcdMethod(fullMethod string) string {
	return strings.TrimPrefix(fullMethod, "/etcdserverpb.")
}
