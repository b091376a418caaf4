package repair

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/allocator"
)

// Snapshot is the full list of Services of the caller's store at one revision of that
// store. Revision is monotonic for one source; it is not an etcd revision of allocd.
type Snapshot struct {
	Revision int64
	Services []Service
}

// Service is what a pass needs to know of one Kubernetes Service.
type Service struct {
	Namespace, Name, UID string
	// ClusterIPs are spec.clusterIPs as written; "" and "None" mean headless.
	ClusterIPs []string
	// NodePorts are the node ports of the Service's ports (0 = none).
	NodePorts []NodePort
	// HealthCheckNodePort is spec.healthCheckNodePort, 0 when none.
	HealthCheckNodePort int
}

// NodePort is one node port of a Service, with its protocol.
type NodePort struct {
	Port     int
	Protocol string
}

// Receipt is when a snapshot reached allocd: the etcd revision of a linearizable read
// made when its first chunk arrived, and the wall time then. An allocation committed
// after Revision is never judged a leak by passes over that snapshot (#8295), and
// LeakGrace is measured from the allocation to Time.
type Receipt struct {
	Revision int64
	Time     time.Time
}

// Earlier returns the receipt that is earlier in both fields: a snapshot forwarded
// between replicas keeps the receipt of the replica that got it first.
func (r Receipt) Earlier(o Receipt) Receipt {
	if o.Revision > 0 && (r.Revision == 0 || o.Revision < r.Revision) {
		r.Revision = o.Revision
	}
	if !o.Time.IsZero() && (r.Time.IsZero() || o.Time.Before(r.Time)) {
		r.Time = o.Time
	}
	return r
}

// Validate checks what a pass cannot judge by itself: a positive revision, and for
// every Service a namespace, a name, a uid not used by another Service, and known port
// protocols. Addresses and port numbers are not checked here: a bad one is a finding
// of the pass (ClusterIPNotValid, PortOutOfRange), as Kubernetes reports it. The error
// is an *InvalidSnapshotError.
func (s Snapshot) Validate() error {
	// At most badrequest.MaxViolations are listed, so that a snapshot with 100k bad
	// Services does not make a 10 MB error.
	e := &InvalidSnapshotError{What: "invalid service snapshot"}
	add := func(field, desc string) { e.Add(field, desc) }
	if s.Revision <= 0 {
		add("snapshot.revision", "must be positive (the revision of the Service store the list was taken at)")
	}
	uids := make(map[string]int, len(s.Services))
	for i, svc := range s.Services {
		f := "snapshot.services[" + strconv.Itoa(i) + "]"
		if svc.Namespace == "" {
			add(f+".namespace", "must not be empty")
		}
		if svc.Name == "" {
			add(f+".name", "must not be empty")
		}
		if svc.UID == "" {
			add(f+".uid", "must not be empty")
		} else if why := allocator.CheckUID(svc.UID); why != "" {
			add(f+".uid", why)
		} else if j, dup := uids[svc.UID]; dup {
			add(f+".uid", fmt.Sprintf("%q is also the uid of snapshot.services[%d]", svc.UID, j))
		} else {
			uids[svc.UID] = i
		}
		for k, p := range svc.NodePorts {
			switch p.Protocol {
			case "", "TCP", "UDP", "SCTP":
			default:
				add(f+".node_ports["+strconv.Itoa(k)+"].protocol",
					fmt.Sprintf("%q is not TCP, UDP or SCTP", p.Protocol))
			}
		}
	}
	if len(e.Violations) == 0 {
		return nil
	}
	return e
}

// readSnapshotFile reads the snapshot file with the configured parser and validates
// it. Errors are *SnapshotFileError.
func (c *Controller) readSnapshotFile(path string) (Snapshot, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Snapshot{}, &SnapshotFileError{Path: path, Err: err}
	}
	s, err := c.cfg.ParseSnapshotFile(b)
	if err != nil {
		return Snapshot{}, &SnapshotFileError{Path: path, Err: err}
	}
	if err := s.Validate(); err != nil {
		return Snapshot{}, &SnapshotFileError{Path: path, Err: err}
	}
	return s, nil
}

// accepted is a snapshot with its receipt. It is never modified once built: passes
// read it without a lock.
type accepted struct {
	Snapshot
	receipt Receipt
	// eventRev is the revision of the last Service event applied over Snapshot,
	// Snapshot.Revision when none.
	eventRev int64
}

// ServiceEvent is one change of a Service after a snapshot, from the event feed the
// Endpoints controller receives: Service is the new state, or, when Deleted, names
// the Service gone (its Namespace and Name).
type ServiceEvent struct {
	Revision int64
	Deleted  bool
	Service  Service
}

// ApplyServiceEvents applies Service changes that followed the kept snapshot, so that
// passes judge against the Services the Endpoints controller sees: a Service deleted
// since the snapshot stops holding its addresses one pass earlier than the next
// snapshot would say so. Events not newer than the kept snapshot or than the last one
// applied are ignored (those of one call sharing the revision of one applied before
// them in the call apply), as are events when no snapshot is kept. The receipt stays the
// snapshot's: an allocation committed after it is still never judged a leak, whatever
// the events say. It returns how many events were applied.
func (c *Controller) ApplyServiceEvents(evs []ServiceEvent) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.snap
	if cur == nil {
		return 0
	}
	last := max(cur.eventRev, cur.Revision)
	var fresh []ServiceEvent
	for _, ev := range evs {
		// Events of one call may share a revision (the message's): each applies.
		if ev.Revision > last || len(fresh) > 0 && ev.Revision == last {
			fresh = append(fresh, ev)
			last = ev.Revision
		}
	}
	if len(fresh) == 0 {
		return 0
	}
	// Passes read the kept snapshot without a lock: build a new one.
	idx := make(map[[2]string]int, len(cur.Services))
	svcs := slices.Clone(cur.Services)
	for i, s := range svcs {
		idx[[2]string{s.Namespace, s.Name}] = i
	}
	gone := make(map[int]bool)
	for _, ev := range fresh {
		k := [2]string{ev.Service.Namespace, ev.Service.Name}
		i, ok := idx[k]
		switch {
		case ev.Deleted && ok:
			gone[i] = true
			delete(idx, k)
		case ev.Deleted:
		case ok:
			svcs[i] = ev.Service
		default:
			// A name deleted earlier in this batch keeps its slot marked gone.
			idx[k] = len(svcs)
			svcs = append(svcs, ev.Service)
		}
	}
	if len(gone) > 0 {
		kept := svcs[:0]
		for i, s := range svcs {
			if !gone[i] {
				kept = append(kept, s)
			}
		}
		svcs = kept
	}
	c.snap = &accepted{Snapshot: Snapshot{Revision: cur.Revision, Services: svcs}, receipt: cur.receipt,
		eventRev: last}
	c.metrics.snapshot(cur.Revision, len(svcs))
	return len(fresh)
}

// Receive makes the linearizable etcd read that stamps a snapshot's arrival. Call it
// when the first chunk arrives, before the rest is read.
func (c *Controller) Receive(ctx context.Context) (Receipt, error) {
	resp, err := c.cli.Get(ctx, c.revisionKey)
	if err != nil {
		return Receipt{}, fmt.Errorf("stamp snapshot receipt: %w", err)
	}
	return Receipt{Revision: resp.Header.Revision, Time: c.cfg.Clock.Now()}, nil
}

// Accept validates a snapshot, records its revision in etcd (refusing with a
// *StaleSnapshotError one older than the last accepted by any replica) and keeps it in
// memory for the passes of this replica. A snapshot with the same revision as the one
// kept replaces its Services but keeps the earlier receipt. Nothing is acknowledged
// before etcd has committed the revision.
func (c *Controller) Accept(ctx context.Context, s Snapshot, r Receipt) error {
	if err := s.Validate(); err != nil {
		return err
	}
	c.acceptMu.Lock()
	defer c.acceptMu.Unlock()
	if err := c.recordRevision(ctx, s.Revision); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur := c.snap; cur != nil {
		if s.Revision < cur.Revision {
			// Only if etcd lost the record (restored from an old backup): memory wins.
			return &StaleSnapshotError{Revision: s.Revision, Accepted: cur.Revision}
		}
		if s.Revision == cur.Revision {
			r = r.Earlier(cur.receipt)
		}
	}
	c.snap = &accepted{Snapshot: s, receipt: r}
	c.metrics.snapshot(s.Revision, len(s.Services))
	c.log.InfoContext(ctx, "service snapshot accepted", "revision", s.Revision,
		"services", len(s.Services), "received_revision", r.Revision)
	return nil
}

// recordRevision stores rev at <prefix>/repair/snapshot-revision unless a newer one is
// there, in one transaction. The value is zero-padded decimal so that etcd's byte
// compare orders it numerically; a missing key fails a value compare, so the put
// sits in the Else branch.
func (c *Controller) recordRevision(ctx context.Context, rev int64) error {
	val := fmt.Sprintf("%020d", rev)
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(c.revisionKey), ">", val)).
		Then(clientv3.OpGet(c.revisionKey)).
		Else(clientv3.OpPut(c.revisionKey, val)).
		Commit()
	if err != nil {
		return fmt.Errorf("record snapshot revision: %w", err)
	}
	if !resp.Succeeded {
		return nil
	}
	last := int64(-1)
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
		if last, err = strconv.ParseInt(string(kvs[0].Value), 10, 64); err != nil {
			// Not stale: the record is unreadable, and would refuse every snapshot.
			return fmt.Errorf("record snapshot revision: %s holds %q: %w", c.revisionKey, kvs[0].Value, err)
		}
	}
	return &StaleSnapshotError{Revision: rev, Accepted: last}
}

// acceptedRevision reads the last snapshot revision accepted by any replica, 0 when
// none was recorded. The read is linearizable: an Accept acknowledged anywhere before
// it started is seen.
func (c *Controller) acceptedRevision(ctx context.Context) (int64, error) {
	resp, err := c.cli.Get(ctx, c.revisionKey)
	if err != nil {
		return 0, fmt.Errorf("read accepted snapshot revision: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	rev, err := strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read accepted snapshot revision: %s holds %q: %w", c.revisionKey,
			resp.Kvs[0].Value, err)
	}
	return rev, nil
}

// snapshot returns the snapshot kept in memory, nil when none.
func (c *Controller) snapshot() *accepted {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snap
}

// snapshotForPass returns the snapshot a pass judges against: the snapshot file when
// one is configured and it is newer than the kept snapshot (it is then accepted like
// a pushed one), else the kept snapshot.
func (c *Controller) snapshotForPass(ctx context.Context) (*accepted, error) {
	if path := c.cfg.SnapshotFile; path != "" {
		s, err := c.readSnapshotFile(path)
		if err != nil {
			return nil, err
		}
		if cur := c.snapshot(); cur == nil || s.Revision > cur.Revision {
			r, err := c.Receive(ctx)
			if err != nil {
				return nil, err
			}
			if err := c.Accept(ctx, s, r); err != nil {
				if cur != nil && isStale(err) {
					c.log.WarnContext(ctx,
						"service snapshot file is older than the accepted snapshot; using the accepted one",
						"path", path, "error", err)
					return cur, nil
				}
				return nil, &SnapshotFileError{Path: path, Err: err}
			}
		}
	}
	if cur := c.snapshot(); cur != nil {
		return cur, nil
	}
	return nil, ErrNoSnapshot
}
