// Command soak measures how large the embedded etcd's database grows over many
// Allocate and Release cycles, with etcd's history compacted or not:
//
//	go run ./tools/soak [-cycles 1000000] [-every 100000] [-clients 64] [-etcd-compaction-interval 5m]
//
// It starts allocd as deployed (daemon.Start: the embedded etcd with fsync on in a
// temporary directory, the compactor, the history budget and defragmentation) and
// drives it over gRPC on loopback: -clients goroutines, each allocating one ClusterIP
// of 10.0.0.0/16 for a new owner and releasing it, until -cycles cycles are done. Every
// -every cycles it prints the database file's size and the part in use (etcd's
// Status), the largest file size seen so far (read every second), the compactions and
// defragmentations allocd made and the rate; at the end the totals. `make soak` runs it
// with the default interval and with compaction off.
package main
