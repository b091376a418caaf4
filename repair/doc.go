// Package repair owns the repair loop of allocd: kube-apiserver's ClusterIP and
// NodePort repair controllers, made safe against the races their users hit. It keeps
// the Service snapshot feed (pushed over gRPC, or read from a JSON file at each pass),
// judges the allocations in etcd against it, repairs what it can, reports the rest,
// and frees leaked allocations only after a countdown. One replica at a time runs
// passes: the leader elected by package leader (its Elector runs Lead for every term);
// the election value is the leader's gRPC address, so that other replicas can forward
// to it. The last accepted snapshot revision is kept
// at <prefix>/repair/snapshot-revision, so that no replica accepts an older one.
//
// The Controller's doc lists every case a pass repairs and the leak rules.
//
// Order of reads: Kubernetes' runOnce (ipallocator/controller/repair.go) reads the
// allocations first and lists the Services after, so that every Service it repairs
// for existed after the allocations were read. A pass has its Services first (a
// snapshot received at etcd revision R, with the events since) and reads the
// allocations later; it keeps Kubernetes' outcome by another mechanism: an item not
// allocated is repaired only if nobody held it at R (a read of etcd's history). One
// released since (its Service deleted, the event not here yet) is reported, not
// allocated again to a Service that is gone. When R is compacted, the oldest revision
// etcd keeps stands in for it, and the finding says so.
//
// ServiceCIDRFull and PortRangeFull: Kubernetes reports them when allocating an item
// in the bitmap it rebuilds from the Services answers ErrFull, and aborts the pass.
// allocd repairs each missing item with allocator.Assign of that very item, which
// succeeds or answers "held by another owner", never "range full" (only dynamic picks
// can find a range full). So a pass over *allocator.Allocator never reports them; they
// remain for a Store that can answer allocator.ErrFull, and then, as in Kubernetes,
// the pass stops without judging leaks (the report's Err says why). A range really
// full of allocations shows as allocd_allocator_available{range} at 0 and as
// RESOURCE_EXHAUSTED on Allocate, not as a repair finding.
//
//	a, _ := allocator.New(ctx, cli, allocCfg)
//	c, err := repair.New(cli, a, repair.Config{
//		Prefix:      "/allocd",
//		Interval:    3 * time.Minute,
//		LeakStrikes: 3,
//		LeakGrace:   time.Minute,
//		Leadership:  el, // the replica's *leader.Elector
//	})
//	if err != nil { ... }
//	g.Go(func() error { return el.Run(ctx, c.Lead) }) // campaigns; passes while leader
//
//	r, _ := c.Receive(ctx)                     // when a snapshot starts to arrive
//	err = c.Accept(ctx, snapshot, r)           // *StaleSnapshotError if older than the last
//	report, err := c.RunRepair(ctx, false)     // on the leader; *leader.NotLeaderError elsewhere
package repair
