package endpoints

import (
	"context"
	"errors"
	"maps"
	"reflect"
	"slices"
	"time"

	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/leader"
)

// labelSkipMirror is the label kube-apiserver's lease reconciler puts on the Endpoints
// of default/kubernetes, so that the EndpointSlice mirroring controller leaves them be.
const labelSkipMirror = "endpointslice.kubernetes.io/skip-mirror"

// keepMaster stores the master leases' Endpoints of default/kubernetes whenever they
// change (SetMasterEndpoints), fenced like every write of the term. It writes no empty
// object where none is stored: an empty set is written only over a non-empty one (the
// last API server shut down cleanly, kubernetes #115804).
func (t *term) keepMaster(ctx context.Context) error {
	for _, listed := range []chan struct{}{t.storedEndpoints.listed, t.storedSlices.listed} {
		select {
		case <-ctx.Done():
			return nil
		case <-listed:
		}
	}
	retry := t.c.cfg.Clock.NewTimer(time.Hour)
	defer retry.Stop()
	resync := t.c.cfg.Clock.NewTicker(t.c.cfg.MasterResync)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.masterc:
		case <-retry.Chan():
		case <-resync.Chan():
		}
		err := t.syncMaster(ctx)
		switch {
		case err == nil:
		case errors.Is(err, leader.ErrFenceLost):
			t.cancel(err)
			return nil
		case errors.Is(err, errConflict):
			retry.Reset(0)
		case ctx.Err() != nil:
			return nil
		default:
			t.c.metrics.masterWriteFailed()
			t.c.log.Warn("storing the kubernetes endpoints failed; retrying", "error", err)
			retry.Reset(time.Second)
		}
	}
}

// syncMaster writes the master leases' Endpoints of default/kubernetes and their
// EndpointSlice, in one transaction, when either differs from what is stored.
func (t *term) syncMaster(ctx context.Context) error {
	m := t.c.masterEndpoints()
	if m == nil {
		return nil
	}
	if err := t.storedEndpoints.reloadUnsure(ctx, masterKey); err != nil {
		return err
	}
	if err := t.storedSlices.reloadUnsure(ctx, masterKey); err != nil {
		return err
	}
	w := &write{}
	desired, changed := t.masterEndpointsObject(m)
	if changed {
		w.ops = append(w.ops, t.endpointsOp(masterKey, t.storedEndpoints.get(masterKey, ""), desired))
	}
	if desired != nil || t.masterSlice() != nil {
		if op, ok := t.masterSliceOp(desired); ok {
			w.ops = append(w.ops, op)
		}
	}
	if len(w.ops) == 0 {
		return nil
	}
	_, err := t.commitNow(ctx, w)
	return err
}

// masterEndpointsObject returns the Endpoints of default/kubernetes the leases make
// (nil: none to store, there being no address and nothing stored) and whether they
// differ from the stored object.
func (t *term) masterEndpointsObject(m *kube.Endpoints) (*kube.Endpoints, bool) {
	cur := t.storedEndpoints.get(masterKey, "")
	desired := &kube.Endpoints{
		Namespace: "default",
		Name:      "kubernetes",
		Labels:    map[string]string{labelSkipMirror: "true"},
		Subsets:   Repack(m.Subsets),
		ManagedBy: kube.ManagedByMasterLease,
	}
	ready, notReady := CountAddresses(desired.Subsets)
	desired.AddressCount = ready + notReady
	if cur.obj == nil && desired.AddressCount == 0 {
		return nil, false
	}
	if cur.obj != nil {
		desired.Annotations = cur.obj.Annotations
		if cur.obj.ManagedBy == kube.ManagedByMasterLease && maps.Equal(cur.obj.Labels, desired.Labels) &&
			subsetsEqual(cur.obj.Subsets, desired.Subsets) {
			return desired, false
		}
	}
	return desired, true
}

// masterSliceName is the name of default/kubernetes' slice, as kube-apiserver names it.
const masterSliceName = "kubernetes"

// masterSlice returns the stored slice of default/kubernetes, nil when none.
func (t *term) masterSlice() *kube.EndpointSlice {
	return t.storedSlices.get(masterKey, masterSliceName).obj
}

// masterSliceOp is the op that makes default/kubernetes' slice follow its Endpoints
// ep, as kube-apiserver's EndpointsAdapter does (EnsureEndpointSliceFromEndpoints):
// the label kubernetes.io/service-name alone, no owner, address type IPv4 unless
// every address is IPv6, the ports of the subset, one endpoint per address with only
// the ready condition set. ok is false when the stored slice already says so.
func (t *term) masterSliceOp(ep *kube.Endpoints) (writeOp, bool) {
	s := &kube.EndpointSlice{Namespace: "default", Name: masterSliceName, Service: "kubernetes",
		Labels: map[string]string{kube.LabelServiceName: "kubernetes"}, AddressType: kube.AddressTypeIPv4}
	if ep != nil && len(ep.Subsets) > 0 {
		sub := ep.Subsets[0]
		v6 := len(sub.Addresses)+len(sub.NotReadyAddresses) > 0
		for _, list := range [][]kube.Address{sub.Addresses, sub.NotReadyAddresses} {
			for _, a := range list {
				v6 = v6 && kube.IsIPv6(a.IP)
				s.Endpoints = append(s.Endpoints, kube.SliceEndpoint{Addresses: []string{a.IP},
					Ready:    kube.Bool(len(list) == len(sub.Addresses) && &list[0] == &sub.Addresses[0]),
					Hostname: a.Hostname, NodeName: a.NodeName, TargetRef: a.TargetRef})
			}
		}
		if v6 {
			s.AddressType = kube.AddressTypeIPv6
		}
		for _, p := range sub.Ports {
			s.Ports = append(s.Ports, kube.Port{Name: p.Name, Port: p.Port, Protocol: p.Protocol})
		}
	}
	cur := t.masterSlice()
	if cur == nil {
		cur = &kube.EndpointSlice{Namespace: "default", Service: "kubernetes", Name: masterSliceName}
	} else if sameMasterSlice(cur, s) {
		return writeOp{}, false
	}
	return t.sliceOp(cur, s), true
}

// sameMasterSlice reports whether two slices of default/kubernetes say the same, of
// what masterSliceOp sets (no appProtocol, no condition but Ready, no hints).
func sameMasterSlice(a, b *kube.EndpointSlice) bool {
	return a.AddressType == b.AddressType && maps.Equal(a.Labels, b.Labels) &&
		slices.EqualFunc(a.Ports, b.Ports, sameMasterPort) &&
		slices.EqualFunc(a.Endpoints, b.Endpoints, sameMasterEndpoint)
}

func sameMasterPort(x, y kube.Port) bool {
	return x.Name == y.Name && x.Port == y.Port && x.Protocol == y.Protocol &&
		x.AppProtocol == nil && y.AppProtocol == nil
}

// sameMasterEndpoint compares two endpoints of default/kubernetes' slice, their Ready
// condition and target by what they point at.
func sameMasterEndpoint(x, y kube.SliceEndpoint) bool {
	return slices.Equal(x.Addresses, y.Addresses) && reflect.DeepEqual(x.Ready, y.Ready) &&
		x.Hostname == y.Hostname && x.NodeName == y.NodeName && x.Zone == y.Zone &&
		reflect.DeepEqual(x.TargetRef, y.TargetRef) &&
		x.Serving == nil && y.Serving == nil && x.Terminating == nil && y.Terminating == nil &&
		x.Hints == nil && y.Hints == nil
}
