package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

func TestRetryPolicyDo(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "down")
	fast := RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	tests := []struct {
		name      string
		policy    RetryPolicy
		results   []error // results of successive attempts; the last repeats
		wantCalls int
		wantCode  codes.Code
	}{
		{"success", fast, []error{nil}, 1, codes.OK},
		{"unavailable then success", fast, []error{unavailable, unavailable, nil}, 3, codes.OK},
		{"unavailable until attempts run out", fast, []error{unavailable}, 5, codes.Unavailable},
		{"no retry on already exists", fast, []error{status.Error(codes.AlreadyExists, "held")}, 1,
			codes.AlreadyExists},
		{"no retry on aborted", fast, []error{status.Error(codes.Aborted, "conflict")}, 1, codes.Aborted},
		{"no retry on internal", fast, []error{unavailable, status.Error(codes.Internal, "bug")}, 2,
			codes.Internal},
		{"retries disabled", RetryPolicy{MaxAttempts: 1}, []error{unavailable}, 1, codes.Unavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := tc.policy.withDefaults().do(context.Background(), func(context.Context) error {
				r := tc.results[min(calls, len(tc.results)-1)]
				calls++
				return r
			})
			if calls != tc.wantCalls || status.Code(err) != tc.wantCode {
				t.Errorf("do(%v) = %v after %d calls; want %v after %d", tc.results, err, calls, tc.wantCode,
					tc.wantCalls)
			}
		})
	}
}

func TestRetryPolicyDoContext(t *testing.T) {
	p := RetryPolicy{MaxAttempts: -1, InitialBackoff: 5 * time.Millisecond,
		MaxBackoff: 20 * time.Millisecond}.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// An unbounded policy retries until its context ends: here at the 5th call, counted
	// rather than timed (a loaded machine stretches any wall-clock window).
	const ends = 5
	calls := 0
	start := time.Now()
	err := p.do(ctx, func(context.Context) error {
		calls++
		if calls == ends {
			cancel()
		}
		return status.Error(codes.Unavailable, "down")
	})
	elapsed := time.Since(start)
	if status.Code(err) != codes.Unavailable {
		t.Errorf("do with an unbounded policy = %v; want the last UNAVAILABLE", err)
	}
	if calls != ends {
		t.Errorf("do made %d calls; want %d: every call until the context ended, none after", calls, ends)
	}
	// 4 waits of at most 20ms each; a wait not capped by MaxBackoff would take seconds.
	if elapsed > 2*time.Second {
		t.Errorf("do returned after %v; want about 4 waits of at most 20ms", elapsed)
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("do returned before the context ended: ctx.Err() = %v", ctx.Err())
	}
}

func TestRetryPolicyBackoff(t *testing.T) {
	p := RetryPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}.withDefaults()
	tests := []struct {
		retry     int
		suggested time.Duration
		want      time.Duration
	}{
		{1, 0, 100 * time.Millisecond},
		{2, 0, 200 * time.Millisecond},
		{3, 0, 400 * time.Millisecond},
		{4, 0, 800 * time.Millisecond},
		{5, 0, time.Second},
		{50, 0, time.Second},
		{1, 500 * time.Millisecond, 500 * time.Millisecond},
		{1, time.Minute, time.Second},
	}
	for _, tc := range tests {
		if got := p.backoff(tc.retry, tc.suggested); got != tc.want {
			t.Errorf("backoff(%d, %v) = %v; want %v", tc.retry, tc.suggested, got, tc.want)
		}
	}
	for _, d := range []time.Duration{0, 1, 10 * time.Millisecond, time.Second} {
		for range 100 {
			if got := jitter(d); got < d/2 || got > d {
				t.Fatalf("jitter(%v) = %v; want within [%v, %v]", d, got, d/2, d)
			}
		}
	}
}

func TestSameEndpoints(t *testing.T) {
	ep := func(rev int64, addrs ...string) *allocdv1.Endpoints {
		e := &allocdv1.Endpoints{Namespace: "default", Name: "kubernetes", Revision: rev}
		if addrs != nil {
			e.Subsets = []*allocdv1.EndpointSubset{{
				Addresses: addrs,
				Ports:     []*allocdv1.EndpointPort{{Name: "https", Port: 6443, Protocol: "TCP"}},
			}}
		}
		return e
	}
	otherPort := ep(1, "10.0.0.1")
	otherPort.Subsets[0].Ports[0].Port = 443
	tests := []struct {
		a, b *allocdv1.Endpoints
		want bool
	}{
		{ep(1, "10.0.0.1"), ep(7, "10.0.0.1"), true},
		{ep(1), ep(2), true},
		{ep(1, "10.0.0.1"), ep(1, "10.0.0.2"), false},
		{ep(1, "10.0.0.1"), ep(1, "10.0.0.1", "10.0.0.2"), false},
		{ep(1, "10.0.0.1"), ep(1), false},
		{ep(1, "10.0.0.1"), otherPort, false},
	}
	for _, tc := range tests {
		if got := sameEndpoints(tc.a, tc.b); got != tc.want {
			t.Errorf("sameEndpoints(%v, %v) = %v; want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
