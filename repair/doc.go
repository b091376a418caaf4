// Package repair owns the repair loop of allocd: kube-apiserver's ClusterIP and
// NodePort repair controllers, made safe against the races their users hit. It keeps
// the Service snapshot feed (pushed over gRPC, or read from a JSON file at each pass),
// judges the allocations in etcd against it, repairs what it can, reports the rest,
// and frees leaked allocations only after a countdown. One replica at a time runs
// passes: the leader elected through etcd (go.etcd.io/etcd/client/v3/concurrency)
// under <prefix>/repair/leader; the election value is the leader's gRPC address, so
// that other replicas can forward to it. The last accepted snapshot revision is kept
// at <prefix>/repair/snapshot-revision, so that no replica accepts an older one.
//
// The Controller's doc lists every case a pass repairs and the leak rules.
//
//	a, _ := allocator.New(ctx, cli, allocCfg)
//	c, err := repair.New(cli, a, repair.Config{
//		Prefix:      "/allocd",
//		Interval:    3 * time.Minute,
//		LeakStrikes: 3,
//		LeakGrace:   time.Minute,
//		Identity:    "10.0.0.5:8443",
//	})
//	if err != nil { ... }
//	g.Go(func() error { return c.Run(ctx) }) // campaigns; passes while leader
//
//	r, _ := c.Receive(ctx)                     // when a snapshot starts to arrive
//	err = c.Accept(ctx, snapshot, r)           // *StaleSnapshotError if older than the last
//	report, err := c.RunRepair(ctx, false)     // on the leader; *NotLeaderError elsewhere
package repair
