// Command scale measures allocd as its store grows: restart time, memory, Allocate's
// rate and the repair pass at 10k, 100k, 300k and 1M allocations, in one run on one
// machine:
//
//	go run ./tools/scale [-points 10000,100000,300000,1000000] [-cidr 10.0.0.0/11]
//
// allocd runs as a process of its own (this program started again as `scale serve`:
// daemon.Start, as cmd/allocd does, with the embedded etcd and fsync on, plus a pprof
// listener), so that it can be killed with SIGKILL. Before the first point and at
// every point it measures, in this order:
//
//  1. Allocate's rate: -clients goroutines over 4 connections for -rate-duration, one
//     ClusterIP for a new owner per call, ok calls only (then released, so that the
//     point stays the point); at -profile-at, a CPU and a heap profile of allocd; with
//     -settle, after that long without writes since the fill;
//  2. allocd's RSS (the embedded etcd included) and the data directory's size;
//  3. repair passes over the point's Services (pushed as a snapshot; RunRepair): the
//     first of the term, and the best of the next two (allocd keeps the holders from
//     its start, so the first lists every allocation only if the holders were not
//     seeded yet);
//  4. kill -9 of allocd, and its start again on its embedded etcd: kill to health
//     SERVING;
//  5. kill -9 of allocd; etcd alone on the data directory (`scale etcd`): its start
//     to ready, and its RSS once ready; with it running, an allocd on --etcd-servers
//     (a replica joining, on an external etcd): start to SERVING, and kill -9 of it:
//     kill to SERVING again; then allocd on its embedded etcd again, for the next fill.
//
// Between points it fills the store with -clients goroutines allocating one ClusterIP
// each for a new owner. `make scale` runs it.
//
// `scale massrelease` (`make mass-release`) measures a namespace deleted instead:
// -owners owners released at once while other clients keep allocating; per 1-s
// window, the Allocates that succeeded, the tombstones waiting and etcd's database
// size, until the tombstones are collected and the database has shrunk back.
package main
