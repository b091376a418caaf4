// Package call tells the failed etcd writes that certainly changed nothing from
// those whose outcome is unknown, and tries the first kind again.
//
// A write that fails with a timeout or a broken connection may still commit: it was
// proposed, and the new leader may apply it. A write that never left this process, or
// that a member refused before proposing it, changed nothing and never will:
//   - no connection to any member: the request was never sent (the gRPC call made no
//     stream, which NotSentInterceptor records);
//   - "etcdserver: no leader": the member has no leader and the request asked for one
//     (clientv3.WithRequireLeader, which Write sets);
//   - "raft proposal dropped": a member with no leader drops proposals;
//   - "etcdserver: too many requests": the member refused it before proposing it.
//
// Those are worth trying again at once, through the next member, and a caller who is
// told about them may retry any request, idempotent or not.
//
//	err := call.Write(ctx, 2*time.Second, 10*time.Second, func(ctx context.Context) error {
//		_, err := cli.Txn(ctx).If(cmp).Then(put).Commit()
//		return err
//	})
//	if call.NotApplied(err) {
//		// nothing was written: the caller may retry any request
//	}
package call
