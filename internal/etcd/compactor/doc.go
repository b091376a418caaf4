// Package compactor keeps etcd's history from filling etcd. etcd keeps every revision of
// every key until it is compacted, and allocd writes a few revisions per Allocate and
// Release: without compaction the database grows until etcd raises its NOSPACE alarm and
// refuses every write.
//
// A Compactor compacts the history older than one interval, once per interval however
// many replicas run one, with kube-apiserver's algorithm
// (k8s.io/apiserver/pkg/storage/etcd3/compact.go):
//
//   - The compaction key (<prefix>/compact_rev_key) is a logical clock: its version counts
//     the compactions done by any replica; its value is the revision compacted last.
//   - Each replica remembers the version it last saw and the revision etcd was at then.
//     Every interval it runs one transaction: if the key's version is still the one it
//     saw, put the key (the version goes up by one) and then compact the revision it
//     remembered, which is one interval old; else take the version and etcd's current
//     revision from the answer and do nothing. Either way it remembers etcd's revision
//     of the answer for next time.
//   - So one replica wins each interval and compacts; the others lose the compare and
//     stand by. If the winner stops, the next replica whose compare succeeds takes over
//     within two intervals. A replica compacts nothing on its first step: it has no
//     revision that is one interval old yet. History is kept for one to two intervals.
//
// A Member looks after an etcd member that allocd runs itself (the embedded one), whose
// space no operator watches: it reads the member's status every second and
//
//   - hurries the Compactor when the database in use has grown by more than a history
//     budget since the last compaction (a burst of writes would otherwise fill the file
//     long before the interval is up), or when the member is out of space: the Compactor
//     then compacts, still through the compaction key, everything older than the newest
//     revision read at least 2 s before; under NOSPACE, which refuses the key's write,
//     without the key; when a hurried step fails, at the next read again;
//   - defragments the member when at least half of its file is free and the free part is
//     worth the pause (compaction frees pages inside the file; only defragmentation gives
//     them back, and etcd's quota counts the file's size), and no more than
//     DefragMaxInUseBytes is in use (the member serves no client meanwhile; above, it
//     logs once that an operator should); Start-time callers use Defragment, before the
//     member serves allocd;
//   - exports the sizes as metrics (allocd does not serve the embedded etcd's own).
//
// etcd has one history for all of its keys: compaction is not limited to --etcd-prefix.
//
//	c, err := compactor.New(cli, compactor.Config{Key: "/allocd" + compactor.KeyName,
//		Interval: 5 * time.Minute})
//	if err != nil { ... }
//	m, err := compactor.NewMember(cli, compactor.MemberConfig{Endpoint: "http://127.0.0.1:12379",
//		HistoryBytes: 16 << 20, DefragFreeBytes: 32 << 20, Compactor: c})
//	if err != nil { ... }
//	g.Go(func() error { return c.Run(ctx) })
//	g.Go(func() error { return m.Run(ctx) })
package compactor
