package endpoints

import (
	"context"
	"errors"
	"maps"
	"time"
)

// masterKey is the Service whose Endpoints the master leases produce.
const masterKey = "default/kubernetes"

// labelSkipMirror is the label kube-apiserver's lease reconciler puts on the Endpoints
// of default/kubernetes, so that the EndpointSlice mirroring controller leaves them be.
const labelSkipMirror = "endpointslice.kubernetes.io/skip-mirror"

// keepMaster stores the master leases' Endpoints of default/kubernetes whenever they
// change (SetMasterEndpoints), fenced like every write of the term. It writes no empty
// object where none is stored: an empty set is written only over a non-empty one (the
// last API server shut down cleanly, kubernetes #115804).
func (t *term) keepMaster(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-t.listed:
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
		case errors.Is(err, errFenceLost):
			t.cancel(err)
			return nil
		case errors.Is(err, errConflict):
			retry.Reset(0)
		case ctx.Err() != nil:
			return nil
		default:
			t.c.log.Warn("storing the kubernetes endpoints failed; retrying", "error", err)
			retry.Reset(time.Second)
		}
	}
}

func (t *term) syncMaster(ctx context.Context) error {
	m := t.c.masterEndpoints()
	if m == nil {
		return nil
	}
	cur := t.storedObj(masterKey)
	desired := &Endpoints{
		Namespace: "default",
		Name:      "kubernetes",
		Labels:    map[string]string{labelSkipMirror: "true"},
		Subsets:   Repack(m.Subsets),
		ManagedBy: ManagedByMasterLease,
	}
	ready, notReady := CountAddresses(desired.Subsets)
	desired.AddressCount = ready + notReady
	if cur.ep == nil && desired.AddressCount == 0 {
		return nil
	}
	if cur.ep != nil {
		desired.Annotations = cur.ep.Annotations
		if cur.ep.ManagedBy == ManagedByMasterLease && maps.Equal(cur.ep.Labels, desired.Labels) &&
			SubsetsEqual(cur.ep.Subsets, desired.Subsets) {
			return nil
		}
	}
	val, err := encode(desired)
	if err != nil {
		return err
	}
	_, err = t.commitNow(ctx, &write{key: masterKey, cur: cur, ep: desired, val: val})
	return err
}
