package kube

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// listWatch lists and watches one kind of object.
type listWatch struct {
	list  func(context.Context, metav1.ListOptions) (runtime.Object, error)
	watch func(context.Context, metav1.ListOptions) (watch.Interface, error)
}

func podsLW(cs kubernetes.Interface, ns string) listWatch {
	api := cs.CoreV1().Pods(ns)
	return listWatch{
		list:  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return api.List(ctx, o) },
		watch: api.Watch,
	}
}

func endpointsLW(cs kubernetes.Interface, ns string) listWatch {
	api := cs.CoreV1().Endpoints(ns)
	return listWatch{
		list:  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return api.List(ctx, o) },
		watch: api.Watch,
	}
}

func slicesLW(cs kubernetes.Interface, ns string) listWatch {
	api := cs.DiscoveryV1().EndpointSlices(ns)
	return listWatch{
		list:  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return api.List(ctx, o) },
		watch: api.Watch,
	}
}

// follower keeps one kind of object followed for a measurement, as an informer's
// reflector does: a list, then a watch from its resourceVersion; a watch that ends (the
// API server closes every watch after a while, and drops one that falls behind) is
// opened again from the last resourceVersion seen, bookmarks included; a
// resourceVersion too old to watch from (410 Gone, Expired) is followed by a new list.
// fn receives every object listed or changed (deleted true for a delete) with the
// time it was received; a relisted object is handed over again, at the relist's time.
type follower struct {
	lw listWatch
	fn func(obj runtime.Object, deleted bool, at time.Time)
	// listed is closed once the first list was handed to fn.
	listed chan struct{}
	// resumed counts watches opened again from the last resourceVersion; relisted,
	// lists after a 410.
	resumed, relisted atomic.Int64
}

func newFollower(lw listWatch, fn func(obj runtime.Object, deleted bool, at time.Time)) *follower {
	return &follower{lw: lw, fn: fn, listed: make(chan struct{})}
}

// start runs the follower until ctx ends and returns a channel closed when it has
// stopped; it returns once the first list was handed over (or ctx ended).
func (f *follower) start(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.run(ctx)
	}()
	select {
	case <-f.listed:
	case <-ctx.Done():
	}
	return done
}

func (f *follower) run(ctx context.Context) {
	rv, first := "", true
	for ctx.Err() == nil {
		if rv == "" {
			l, err := f.lw.list(ctx, metav1.ListOptions{})
			if err != nil {
				pause(ctx, time.Second)
				continue
			}
			at := time.Now()
			items, _ := meta.ExtractList(l)
			for _, o := range items {
				f.fn(o, false, at)
			}
			acc, _ := meta.ListAccessor(l)
			rv = acc.GetResourceVersion()
			if first {
				close(f.listed)
				first = false
			} else {
				f.relisted.Add(1)
			}
		}
		var err error
		rv, err = f.watchFrom(ctx, rv)
		if gone(err) {
			rv = ""
			continue
		}
		if ctx.Err() == nil {
			f.resumed.Add(1)
			if err != nil {
				pause(ctx, 200*time.Millisecond)
			}
		}
	}
}

// watchFrom watches from rv until the watch ends, and returns the last resourceVersion
// seen.
func (f *follower) watchFrom(ctx context.Context, rv string) (string, error) {
	w, err := f.lw.watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
	if err != nil {
		return rv, err
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		at := time.Now()
		if ev.Type == watch.Error {
			return rv, apierrors.FromObject(ev.Object)
		}
		if acc, err := meta.Accessor(ev.Object); err == nil {
			rv = acc.GetResourceVersion()
		}
		if ev.Type != watch.Bookmark {
			f.fn(ev.Object, ev.Type == watch.Deleted, at)
		}
	}
	return rv, nil
}

func gone(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// followAllocd follows allocd's Endpoints and EndpointSlices of namespace ns, as they
// are committed in its etcd, resuming a broken watch from the last revision seen (or
// from the current objects when that revision was compacted), until ctx ends.
func followAllocd(ctx context.Context, c *client.Client, ns string,
	onEP func(*allocdv1.ServiceEndpoints, time.Time), onSlice func(*allocdv1.EndpointSlice, time.Time)) <-chan struct{} {
	done := make(chan struct{}, 2)
	go func() {
		var rev int64
		for ctx.Err() == nil {
			err := c.WatchServiceEndpoints(ctx, &allocdv1.WatchServiceEndpointsRequest{Namespace: ns, StartRevision: rev},
				func(r *allocdv1.WatchServiceEndpointsResponse) error {
					rev = r.GetRevision()
					onEP(r.GetEndpoints(), time.Now())
					return nil
				})
			if errors.Is(err, client.ErrCompacted) {
				rev = 0
			}
			pause(ctx, 100*time.Millisecond)
		}
		done <- struct{}{}
	}()
	go func() {
		var rev int64
		for ctx.Err() == nil {
			err := c.WatchEndpointSlices(ctx, &allocdv1.WatchEndpointSlicesRequest{Namespace: ns, StartRevision: rev},
				func(r *allocdv1.WatchEndpointSlicesResponse) error {
					rev = r.GetRevision()
					onSlice(r.GetEndpointSlice(), time.Now())
					return nil
				})
			if errors.Is(err, client.ErrCompacted) {
				rev = 0
			}
			pause(ctx, 100*time.Millisecond)
		}
		done <- struct{}{}
	}()
	out := make(chan struct{})
	go func() {
		<-done
		<-done
		close(out)
	}()
	return out
}

// podReady is the Pod's Ready condition.
func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// sliceReady is an endpoint's ready condition (absent: not ready).
func sliceReady(e discoveryv1.Endpoint) bool { return e.Conditions.Ready != nil && *e.Conditions.Ready }
