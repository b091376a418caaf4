// Command scale measures allocd as its store grows: restart time, memory, the rate and
// CPU of Allocate and Release, and the repair pass at 10k, 100k, 300k and 1M
// allocations, in one run on one machine:
//
//	go run ./tools/scale [-points 10000,100000,300000,1000000] [-cidr 10.0.0.0/11]
//
// allocd runs as a process of its own (this program started again as `scale serve`:
// daemon.Start, as cmd/allocd does, with the embedded etcd and fsync on, plus a pprof
// listener and /metrics), so that it can be killed with SIGKILL. Before the first point
// and at every point it measures, in this order:
//
//  1. the rate: -clients goroutines over 4 connections for -rate-duration (5 minutes),
//     each making Allocate+Release cycles (one ClusterIP for a new owner, then the
//     release of that owner: the store stays at its point, and every compaction and
//     tombstone collection the cycles cause falls in the window), and allocd's CPU per
//     cycle (the whole process, from /proc) and the compactions in the window (from
//     /metrics); at -profile-at, a CPU profile of allocd over the window, a heap
//     profile after; with -settle, after that long without writes since the fill;
//  2. Allocate's CPU against its controls, measured in the same run (-share-duration):
//     the whole allocd process's CPU per Allocate of new owners, a bare gRPC server's
//     (`scale held`, another process, no interceptors) per call held as long as
//     Allocate's p50, and etcd's floor, allocd's CPU per allocation for the same
//     transactions sent to its embedded etcd with no allocd code;
//  3. allocd's RSS (the embedded etcd included) and the data directory's size;
//  4. repair passes over the point's Services (pushed as a snapshot; RunRepair): the
//     first of the term, and the best of the next two;
//  5. kill -9 of allocd, and its start again on its embedded etcd: kill to health
//     SERVING;
//  6. kill -9 of allocd; etcd alone on the data directory (`scale etcd`): its start
//     to ready, and its RSS once ready; with it running, an allocd on --etcd-servers
//     (a replica joining, on an external etcd): start to SERVING, and kill -9 of it:
//     kill to SERVING again; then allocd on its embedded etcd again, for the next fill.
//
// Between points it fills the store with -clients goroutines allocating one ClusterIP
// each for a new owner. `make scale` runs it. With -keep the work directory stays, for
//
//   - -restarts N: N rounds of the restarts of step 5 and 6 on that store, each start
//     profiled (CPU, block, with -restart-trace an execution trace) and split into
//     daemon.Start's steps (etcd, space, services): allocd's own part is what follows
//     etcd's; with -restart-churn D, every kill -9 after D of Allocate+Release cycles
//     (the index's checkpoint then behind, as under load);
//   - -ab-full DIR, -ab-vs BIN, -ab-env VARS, -ab-args ARGS: rate runs alternating
//     between two sides (an empty store and that one; this build and another; allocd
//     with and without those environment variables or arguments), each on a fresh
//     allocd, with the ratios pair by pair; with -ab-share, runs of step 2 instead.
//
// `scale massrelease` (`make mass-release`) measures a namespace deleted instead:
// -owners owners released at once while other clients keep allocating; per 1-s
// window, the Allocates that succeeded, the tombstones waiting and etcd's database
// size, until the tombstones are collected and the database has shrunk back.
package main
