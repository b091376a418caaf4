package endpoints

import (
	"context"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/allocd/allocd/endpoints/kube"
)

// The reads of the stored Endpoints objects and EndpointSlices, served by every
// replica from etcd: Get, List and ListSlices (paged, every page read at the revision
// of the first), Watch and WatchSlices (resumable from a revision), and WatchStored and
// WatchSlicesStored for the server, which sends a stored object on as it is stored when
// it can. One implementation, store (store.go), serves both kinds.

// endpointsStore reads the stored Endpoints objects.
func (c *Controller) endpointsStore() store[*kube.Endpoints] {
	return store[*kube.Endpoints]{cli: c.cli, prefix: c.prefix, what: "endpoints", depth: 1,
		decode: func(kv *mvccpb.KeyValue) (*kube.Endpoints, error) {
			return decodeEndpoints(kv.Value, kv.ModRevision, kv.CreateRevision)
		},
		exact: exactEndpoints}
}

// slicesStore reads the stored slices; a slice's Service is the one of its key.
func (c *Controller) slicesStore() store[*kube.EndpointSlice] {
	s := store[*kube.EndpointSlice]{cli: c.cli, prefix: c.slicePrefix, what: "endpoint slices", depth: 2,
		exact: exactSlice}
	s.decode = func(kv *mvccpb.KeyValue) (*kube.EndpointSlice, error) {
		svcKey, _, ok := s.split(kv.Key)
		if !ok {
			return nil, fmt.Errorf("%s is not the key of an endpoint slice", kv.Key)
		}
		_, svc, _ := strings.Cut(svcKey, "/")
		return decodeSlice(kv.Value, svc, kv.ModRevision, kv.CreateRevision)
	}
	return s
}

// Get returns the stored Endpoints of namespace/name (a linearizable read), or
// ErrNotFound.
func (c *Controller) Get(ctx context.Context, namespace, name string) (*kube.Endpoints, error) {
	if err := validName(namespace, name); err != nil {
		return nil, err
	}
	resp, err := c.cli.Get(ctx, c.etcdKey(namespace+"/"+name))
	if err != nil {
		return nil, fmt.Errorf("read endpoints %s/%s: %w", namespace, name, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: %s/%s", ErrNotFound, namespace, name)
	}
	kv := resp.Kvs[0]
	return decodeEndpoints(kv.Value, kv.ModRevision, kv.CreateRevision)
}

// List returns up to pageSize objects (0: DefaultPageSize; capped at MaxPageSize) of
// namespace ("" for all), sorted by namespace and name, after pageToken. Every page of
// one listing is read at the revision of the first (returned), so that a listing is
// one consistent state; a page whose revision was compacted meanwhile is a
// *CompactedError. next is "" on the last page.
func (c *Controller) List(ctx context.Context, namespace string, pageSize int,
	pageToken string) (eps []*kube.Endpoints, next string, rev int64, err error) {
	if err := validScope("namespace", namespace); err != nil {
		return nil, "", 0, err
	}
	return c.endpointsStore().list(ctx, namespace, pageSize, pageToken)
}

// ListSlices returns up to pageSize slices (0: DefaultPageSize; capped at MaxPageSize)
// of every namespace (namespace ""), of one namespace, or of one Service (service with
// its namespace), sorted by namespace, Service and name, after pageToken, as List does
// for Endpoints.
func (c *Controller) ListSlices(ctx context.Context, namespace, service string, pageSize int,
	pageToken string) (sl []*kube.EndpointSlice, next string, rev int64, err error) {
	scope, err := sliceScope(namespace, service)
	if err != nil {
		return nil, "", 0, err
	}
	return c.slicesStore().list(ctx, scope, pageSize, pageToken)
}

// Watch sends the changes of the stored objects of namespace ("" for all) to send: with
// startRev 0, first every current object as Added (read at one revision R), then the
// changes after R; with startRev N, the changes after N. It returns when ctx ends (nil),
// when send fails (its error), with a *CompactedError when the history it needs was
// compacted, or with the watch's error (etcd unreachable, no leader): the caller then
// watches again from the last revision it got.
func (c *Controller) Watch(ctx context.Context, namespace string, startRev int64,
	send func(WatchEvent) error) error {
	if err := validScope("namespace", namespace); err != nil {
		return err
	}
	return c.endpointsStore().watch(ctx, namespace, startRev,
		func(t WatchType, e *kube.Endpoints, rev int64) error {
			return send(WatchEvent{Type: t, Endpoints: e, Revision: rev})
		})
}

// WatchSlices sends the changes of the stored slices of namespace ("" for all) to
// send, as Watch does for Endpoints.
func (c *Controller) WatchSlices(ctx context.Context, namespace string, startRev int64,
	send func(SliceWatchEvent) error) error {
	if err := validScope("namespace", namespace); err != nil {
		return err
	}
	return c.slicesStore().watch(ctx, namespace, startRev,
		func(t WatchType, s *kube.EndpointSlice, rev int64) error {
			return send(SliceWatchEvent{Type: t, Slice: s, Revision: rev})
		})
}

// WatchStored is Watch for a caller that sends the objects on in the API's form: an
// event carries the object's stored form (Stored, Endpoints nil) when that is exact,
// else the decoded object as Watch sends it.
func (c *Controller) WatchStored(ctx context.Context, namespace string, startRev int64,
	send func(WatchEvent) error) error {
	if err := validScope("namespace", namespace); err != nil {
		return err
	}
	return c.endpointsStore().watchStored(ctx, namespace, startRev,
		func(t WatchType, st *Stored, e *kube.Endpoints, rev int64) error {
			return send(WatchEvent{Type: t, Endpoints: e, Stored: st, Revision: rev})
		})
}

// WatchSlicesStored is WatchSlices for a caller that sends the slices on in the API's
// form, as WatchStored is for Endpoints.
func (c *Controller) WatchSlicesStored(ctx context.Context, namespace string, startRev int64,
	send func(SliceWatchEvent) error) error {
	if err := validScope("namespace", namespace); err != nil {
		return err
	}
	return c.slicesStore().watchStored(ctx, namespace, startRev,
		func(t WatchType, st *Stored, s *kube.EndpointSlice, rev int64) error {
			return send(SliceWatchEvent{Type: t, Slice: s, Stored: st, Revision: rev})
		})
}

// validName refuses names that would escape their place in the key space.
func validName(namespace, name string) error {
	inv := &InvalidError{}
	if namespace == "" || strings.Contains(namespace, "/") {
		inv.Add("namespace", "must be a non-empty name without '/'")
	}
	if name == "" || strings.Contains(name, "/") {
		inv.Add("name", "must be a non-empty name without '/'")
	}
	return inv.OrNil()
}

// validScope refuses a namespace (or name) that would escape its place in the key
// space; "" is every namespace.
func validScope(field, s string) error {
	if strings.Contains(s, "/") {
		return &InvalidError{Violations: []violation{{Field: field, Description: "must not contain '/'"}}}
	}
	return nil
}

// sliceScope is the part of the key space a listing of slices covers.
func sliceScope(namespace, service string) (string, error) {
	inv := &InvalidError{}
	if strings.Contains(namespace, "/") {
		inv.Add("namespace", "must not contain '/'")
	}
	switch {
	case strings.Contains(service, "/"):
		inv.Add("service_name", "must not contain '/'")
	case service != "" && namespace == "":
		inv.Add("namespace", "required with service_name")
	}
	if err := inv.OrNil(); err != nil {
		return "", err
	}
	if service != "" {
		return namespace + "/" + service, nil
	}
	return namespace, nil
}
