// Command bench measures allocd's Allocate against an empty gRPC call and against a
// Kubernetes-style allocator, all in one process on one embedded etcd with fsync on:
//
//	go run ./tools/bench [-duration 10s] [-clients 64] [-conns 4] [-repeat 3]
//
// It starts the embedded etcd in a temporary directory, an Allocator (on an
// in-process etcd client, as allocd with its embedded etcd; -in-process-etcd-client=false
// for gRPC over loopback, as with --etcd-servers) and a gRPC server built by
// server.NewGRPCServer (the production interceptors) on loopback,
// then runs, each after a warm-up and repeated -repeat times (medians reported):
//
//  1. grpc.health.v1.Health/Check, the empty unary call;
//  2. Allocate of one ClusterIP for a distinct owner per call, in -cidr (a /8);
//  3. Allocate of one ClusterIP and one NodePort (stops early before the ports run out);
//  4. the etcd floor: etcd's own cost for the keys of an Allocate, with no gRPC and no
//     allocd code: transactions of as many allocations as the Allocate run grouped
//     per commit, each an item key and an owner record created under a
//     CreateRevision compare, on the same in-process client;
//  5. a Kubernetes-style allocator: the whole bitmap of a /12 (128 KiB) in one key,
//     Get then Txn(ModRevision compare, Put) per allocation, retried on conflict;
//  6. Allocate in process with one ServiceCIDR and with 1,000 of them, 999 full and
//     ahead of the one with room (-cidr-runs), and the heap of 1,000 /16s;
//
// and prints a table, the CPU per call of the empty call, the floor and Allocate,
// allocd's own share (Allocate - empty - floor), and the ratios: Allocate against the
// empty call (goal >= 0.45) and against the Kubernetes-style baseline (>= 40).
package main
