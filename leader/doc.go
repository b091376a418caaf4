// Package leader owns allocd's one election and the fence that proves it in writes:
// the seam every controller that must run on one replica at a time stands on (repair,
// the Endpoints controller, the EndpointSlice controller), side by side, in the same
// terms of leadership.
//
// An Elector campaigns through etcd (go.etcd.io/etcd/client/v3/concurrency) with this
// replica's identity, its gRPC address as the other replicas dial it, as the election
// value, so that a replica that does not lead can name the leader and forward calls to
// it. For every term it wins, Run runs each controller's Lead function with the term's
// context and Fence; the term ends when the election session is lost, when ctx ends, or
// when any Lead function returns an error while the term lasts (the replica resigns and
// campaigns again). Run waits for every Lead of a term before the next term starts, so
// terms of one replica never overlap.
//
// Leader names the leader for the replicas that do not lead, so that they can forward
// to it. While Run runs, a watch of the election keeps a view of its candidates (the
// leader is the key with the lowest CreateRevision, as concurrency.Election.Leader
// defines it), listed again after the watch fails (a compacted history, a lost etcd
// leader, a closed channel): Leader costs no read of etcd. The view may trail etcd; a
// replica it names that no longer leads refuses (*NotLeaderError), and ReadLeader reads
// etcd. Whether this replica leads never comes from the view, only from its own term.
//
// A Fence is the election key of a term and its CreateRevision. A controller's write
// is an etcd transaction that compares it (Fence.Cmp); when that compare fails, a newer
// leader may be writing, and the write must not happen: Fence.Held tells a lost fence
// from a conflict of the write's own compares. A deposed leader can therefore never
// write after its successor was elected, whatever its clocks and pauses.
//
//	el, err := leader.New(cli, leader.Config{Prefix: "/allocd/repair/leader", Identity: "10.0.0.5:8080"})
//	if err != nil { ... }
//	g.Go(func() error { return el.Run(ctx, repairCtl.Lead, endpointsCtl.Lead) })
//
//	// in a controller's write:
//	resp, err := cli.Txn(ctx).If(f.Cmp(), myCmps...).Then(ops...).Else(f.Get()).Commit()
//	if err == nil && !resp.Succeeded && !f.Held(resp, 0) { /* the term is over */ }
package leader
