package server

import (
	"context"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// fakeStream is a server stream that receives recv messages, then recvErr.
type fakeStream struct {
	grpc.ServerStream
	recv    int
	recvErr error
}

func (s *fakeStream) Context() context.Context     { return context.Background() }
func (s *fakeStream) SendMsg(any) error            { return nil }
func (s *fakeStream) SetHeader(metadata.MD) error  { return nil }
func (s *fakeStream) SendHeader(metadata.MD) error { return nil }
func (s *fakeStream) SetTrailer(metadata.MD)       {}
func (s *fakeStream) RecvMsg(any) error {
	if s.recv == 0 {
		return s.recvErr
	}
	s.recv--
	return nil
}

// series flattens a registry's metrics into "name{labels}" -> value; a histogram gives
// its sample count (the durations differ between two runs).
func series(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				ls = append(ls, lp.GetName()+"="+lp.GetValue())
			}
			name := mf.GetName() + "{" + strings.Join(ls, ",") + "}"
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[name] = m.GetCounter().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[name+" count"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// TestGRPCMetricsAsProvider: the interceptors count what go-grpc-middleware's Prometheus
// provider counts, series for series (the dashboards and alerts read them): the
// pre-initialized series of the registered methods, unary calls that succeed or fail
// (a status, a context error, another error), streams of each type, their messages.
func TestGRPCMetricsAsProvider(t *testing.T) {
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, healthpb.UnimplementedHealthServer{})
	allocdv1.RegisterLeaseServiceServer(gs, allocdv1.UnimplementedLeaseServiceServer{})
	prov := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	mine := newGRPCMetrics()
	regProv, regMine := prometheus.NewRegistry(), prometheus.NewRegistry()
	regProv.MustRegister(prov)
	regMine.MustRegister(mine)
	prov.InitializeMetrics(gs)
	mine.initialize(gs)

	unaryErrs := []error{nil, status.Error(codes.NotFound, "x"), context.Canceled,
		context.DeadlineExceeded, errors.New("plain"), status.Error(codes.Unavailable, "y")}
	streams := []struct {
		info    grpc.StreamServerInfo
		recv    int
		recvErr error
		err     error
	}{
		{grpc.StreamServerInfo{FullMethod: "/allocd.v1.LeaseService/WatchEndpoints", IsServerStream: true},
			1, io.EOF, nil},
		{grpc.StreamServerInfo{FullMethod: "/allocd.v1.RepairService/PushServiceSnapshot",
			IsClientStream: true}, 3, io.EOF, nil},
		{grpc.StreamServerInfo{FullMethod: "/x.Y/Bidi", IsClientStream: true, IsServerStream: true},
			0, status.Error(codes.Aborted, "z"), status.Error(codes.Aborted, "z")},
	}
	for _, ic := range []struct {
		unary  grpc.UnaryServerInterceptor
		stream grpc.StreamServerInterceptor
	}{{prov.UnaryServerInterceptor(), prov.StreamServerInterceptor()}, {mine.unary(), mine.stream()}} {
		for i, e := range unaryErrs {
			info := &grpc.UnaryServerInfo{FullMethod: "/allocd.v1.LeaseService/Renew"}
			if i%2 == 1 {
				info.FullMethod = "/grpc.health.v1.Health/Check"
			}
			ic.unary(context.Background(), nil, info,
				func(context.Context, any) (any, error) { return nil, e })
		}
		ic.unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "malformed"},
			func(context.Context, any) (any, error) { return nil, nil })
		for _, st := range streams {
			ss := &fakeStream{recv: st.recv, recvErr: st.recvErr}
			ic.stream(nil, ss, &st.info, func(_ any, s grpc.ServerStream) error {
				for s.RecvMsg(nil) == nil {
					s.SendMsg(nil)
				}
				s.SendMsg(nil)
				return st.err
			})
		}
	}
	want, got := series(t, regProv), series(t, regMine)
	if len(want) < 100 {
		t.Fatalf("the provider's registry has %d series; want the pre-initialized ones too", len(want))
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if g, ok := got[k]; !ok || g != want[k] {
			t.Errorf("%s = %v (present: %v); want %v, as the provider", k, g, ok, want[k])
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s = %v; the provider has no such series", k, got[k])
		}
	}
}

// BenchmarkMetricsInterceptor compares the provider's unary interceptor with ours on
// one method: one call each, a handler that does nothing.
func BenchmarkMetricsInterceptor(b *testing.B) {
	info := &grpc.UnaryServerInfo{FullMethod: "/allocd.v1.AllocatorService/Allocate"}
	h := func(context.Context, any) (any, error) { return nil, nil }
	prov := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	for _, bc := range []struct {
		name string
		ic   grpc.UnaryServerInterceptor
	}{{"provider", prov.UnaryServerInterceptor()}, {"allocd", newGRPCMetrics().unary()}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bc.ic(context.Background(), nil, info, h)
			}
		})
	}
}
