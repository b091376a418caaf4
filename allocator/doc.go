// Package allocator owns the ClusterIP ranges (IPv4, IPv6, dual-stack) and the
// NodePort range of allocd: it allocates, assigns, releases and lists addresses and
// ports for owners (Services), with etcd as the only source of truth.
//
//	a, err := allocator.New(ctx, cli, allocator.Config{
//		Prefix:          "/allocd",
//		ClusterIPRanges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
//		NodePortRange:   allocator.DefaultNodePortRange,
//	})
//	if err != nil { ... }
//	go a.Run(ctx) // the watch and the group committer; the caller waits for it
//	res, err := a.Allocate(ctx, allocator.Request{
//		Owner: allocator.Owner{Namespace: "default", Name: "web", UID: "0f6c..."},
//		NodePortCount: 1,
//	})
//
// # Parts
//
// An Allocator is wired from parts (new.go), each a type that owns its state; its own
// methods are the API's calls and the transactions they make (allocate.go, batch.go,
// release.go, transfer.go, read.go, list.go, cidrs.go).
//
// The store (store.go, codec.go) is the etcd layer: the keys, the values' JSON, the
// record of the ranges, reads of owner records and the streamed or paged listing of a
// prefix. It knows no index and no transaction of its own.
//
// The range index (rangeIndex, index.go; table.go, ranges.go and package bitmap below
// it) is the ranges in memory: a table of ranges, each a bitmap of used and pending
// offsets, that a watch of the item keys and the ServiceCIDRs keeps current, and the
// revision it reflects, which Sync waits for. Its watch is the one reader of etcd's
// events: it hands the epoch key's changes to the epochs, who holds each item to the
// holders, and the count of changes to the checkpointer. It is loaded from a checkpoint
// and the events since (replayed through several watches at once, catchup.go), or by
// listing every item key. TestIndexSettle, TestCatchUpInParts and the tests of the watch
// (TestWatchAcrossReplicas, TestWatchAfterCompaction) are its own.
//
// The epochs (epochs, epoch.go) keep the epoch that every write compares, move it on
// while tombstones wait, and collect the tombstones once no transaction built before
// them can commit (the comment in epoch.go says why: no allocation comes back). Its
// failures are counted by step (allocd_allocator_epoch_failures_total).
// TestEpochSeenKeepsPairs, TestEpochRoundFailures and the collection tests
// (collect_test.go) are its own.
//
// The checkpointer (checkpointer, checkpoint.go) writes the index's used bitsets at a
// revision when enough changed, and reads the last one back for the index's load, so
// that a replica starts without listing a million keys. TestCheckpointerMaybe and
// checkpoint_test.go are its own.
//
// The holders (holders, holders.go) are who holds every item, as a hash of the owner's
// UID, kept by the watch once a listing seeded them: a repair pass reads only the
// allocations whose holder it does not expect (ListExcept). Its run keeps them from
// the start (Config.KeepHolders). holders_test.go is its own.
//
// The owner hints (ownerHints, hints.go) are the owner records last written or read,
// a guess of their revision that saves a request of an existing owner a conflict.
//
// The committer (committer, committer.go) is the group commit's queue and its slots:
// it packs queued requests (op, op.go) into transactions of at most 128 keys, none
// twice, with up to Config.CommitConcurrency in flight; the transaction of one batch
// and what a failed compare says are the Allocator's (batch.go). TestCommitterTake is
// its own; TestGroupCommit and batch_test.go test it with the Allocator.
//
// Failures of the background steps (failures, failures.go) are logged at warning (the
// first of a run, then once a minute) and counted by step
// (allocd_allocator_background_failures_total): a replica whose watch, checkpoints,
// drain or holders keep failing is seen. The end of a session of the index's watch is
// counted under step watch and logged by watch.Loop, at every end. TestFailures is its
// own.
//
// # Storage
//
// One etcd key per allocation, never one key per range (Kubernetes keeps a whole
// range's bitmap in one key: 128 KiB per write for a /12, one key that serialises
// every writer):
//
//	<prefix>/config/ranges          {"clusterIPRanges":["10.96.0.0/12","fd00::/108"],
//	                                 "nodePortRange":"30000-32767"}
//	                                written once (CreateRevision == 0); a replica configured
//	                                with another node port range refuses to start
//	                                (*RangesMismatchError)
//	<prefix>/config/servicecidrs/<name>
//	                                {"name","cidrs":[..],"state":"ready"|"terminating",..}: the
//	                                ClusterIP ranges (servicecidr.go); "kubernetes" is seeded
//	                                from the flags; every allocation compares the revision
//	                                of the one it draws from (see docs/operators/service-cidrs.md)
//	<prefix>/clusterips/<ip>        {"namespace":..,"name":..,"uid":..,"time":RFC 3339}
//	<prefix>/nodeports/<port>       the same; <ip> is the canonical form (netip.Addr.String)
//	<prefix>/owners/<uid>           {"namespace","name","uid","clusterIPs":[..],"nodePorts":[..],
//	                                 "last":{"hash","clusterIPs","nodePorts"}}; after a full
//	                                release a tombstone (no items) for 10 to 20 s (epoch.go)
//	<prefix>/epoch                  rewritten every second by one replica: its version is
//	                                the epoch every write transaction compares (epoch.go)
//	<prefix>/tombstones/<u>/<uid>   the tombstones to collect once the epoch is past u + 10
//	<prefix>/checkpoints/head, data/<rev>/<n>
//	                                the index's used bitsets at a revision (checkpoint.go)
//
// An item key is created with a CreateRevision(key) == 0 compare: that compare, not
// any process's memory, is what keeps two replicas from handing out the same address
// or port. The owner record lists what the owner holds and its last Allocate request
// (a hash of it, and its result); it is written in the same transaction as the items,
// with CreateRevision == 0 for a new owner or ModRevision == the one read for an
// existing one. A retry of the same request by the same owner UID finds the record
// and returns the stored result (Replayed), also when the range has filled since (a
// request that finds its range full reads the owner record before failing); a
// different request of an existing owner allocates more. One request names at most
// MaxItems items, so that its keys and its record fit in etcd's 128 operations per
// transaction. Items move between owners (Reassign, one item; Transfer, what an owner
// holds) in one transaction that rewrites each item key, compared at the revision read,
// with both owners' records: an item is never free nor held twice on the way. ListPage
// lists the owners of a UID prefix from their records (an admission webhook's
// provisional owners, "admission/...").
//
// # Index
//
// In memory, each range has bitsets of offsets (github.com/bits-and-blooms/bitset):
// used (what the watch has seen in etcd) and pending (local reservations whose
// outcome the watch has not seen yet; cleared once the watch passes the revision
// that settled them, or at once when the reservation failed). A dynamic pick takes
// an offset that is neither, from a random start with wrap-around, in the upper
// (dynamic) band first and in the lower (static) band only when the upper one is
// full: KEP-3070's min(max(16, size/16), 256) addresses (none up to 16) and
// KEP-3668's min(max(16, size/32), 128) ports. Offsets map to addresses through the
// 128-bit As16 form with math/bits; ranges hold up to 2^24 addresses (2 MiB per
// bitset). New loads the index from the last checkpoint and the watch's events since
// (checkpoint.go), or lists every item key when it cannot. The watch starts at the
// loaded revision + 1 and re-lists after a
// compaction. Free and Ranges answer from the index and may lag a write by the
// watch's delay; Sync (which ListRanges calls) first waits until the watch has reached
// the revision etcd is at, asking for a progress notification to get past writes
// outside the watched keys.
//
// # Listing
//
// List (the repair pass's read of every allocation) streams each prefix with etcd's
// RangeStream: chunks read at one revision, the range walked once. Servers without it
// (etcd before 3.7, and the in-process client allocd uses with its embedded etcd) are
// read in pages of 50,000 keys at the first page's revision: etcd counts the rest of
// the range for every page, so small pages cost quadratic time. Values in the form
// the allocator writes are decoded without reflection, the owner strings of a chunk
// sharing one allocation.
//
// # Group commit
//
// While Run runs, Allocate and Assign calls queue for a committer that packs as many
// requests as fit in 128 keys into one transaction (If all compares, Then all puts).
// It starts a transaction at once when none is in flight, and another one (up to
// Config.CommitConcurrency) as soon as half a transaction's worth of keys has queued:
// requests that arrive while etcd is busy share the next transaction. When a compare
// fails, a read of the batch's keys says why: a specific item held by another owner
// fails its request (*AllocatedError), an existing owner record replays or is
// followed, a taken dynamic pick is picked again, a specific item the owner holds
// already is kept (compared at its ModRevision in the next round, not written; asked
// for again if it was released meanwhile); the other requests of the batch are
// retried as they are, each a bounded number of times (then ErrConflict). So that a
// request of an existing owner does not fail its whole transaction once just to
// learn the owner record's revision, the allocator remembers the records it last
// wrote or read (of the last 4096 to 8192 owners): a guess that the compare still
// checks, a stale one costing that one conflict. An owner whose remembered last
// request is the one asked for again reads its record first and replays it.
//
// Package endpoints has a group committer too (endpoints/commit.go), and the two share
// the scheduling (a queue, transactions packed under etcd's limits, a few in flight)
// but not what a transaction is: here every replica commits at once, each request is a
// plan (dynamic picks, an owner record to follow) that a failed compare changes (pick
// again, replay, follow the record), read back outside the transaction so that etcd's
// log holds no Else for the rare conflict, and an unknown outcome fails its callers
// (their retry replays); there, one leader writes objects it has computed, fenced by
// the election key, a write that conflicts goes back to its sync whole, the others are
// committed again without it, and a write too large for one transaction is split in
// order. A shared committer would carry the queue alone and make each side's conflict
// rules a callback; each is kept with its package.
//
// # Logs
//
// Every write is one line at info once etcd committed it: "allocated" (namespace,
// name, uid, ranges, cluster_ips, node_ports, revision), "assigned" (with range),
// "released" (with force, and the holder_uids of other owners a forced release took
// items from), "reassigned" (with to_namespace, to_name, to_uid, if_mod_revision) and
// ReleaseIf's "released" (with if_mod_revision), "transferred" (with to_namespace,
// to_name, to_uid, cluster_ips, node_ports). Replays and no-ops write nothing and
// log nothing; a full release (or transfer of everything) of an owner that holds
// nothing writes a tombstone anew (epoch.go) and logs nothing.
package allocator
