// Command epbench measures the Endpoints and EndpointSlice controllers as an operator
// sees them: allocd runs as its own process (the binary of ./cmd/allocd, built into a
// temporary directory; its embedded etcd with fsync on; default flags but for loopback
// listeners and --repair-interval 1h), and this process feeds it over gRPC with the Go
// client and watches the results, as a shim and a consumer would:
//
//	go run ./tools/epbench [-runs 3] [-churn 60s] [-baseline OLD_ALLOCD] [-profile-dir DIR]
//
// One run:
//
//  1. opens a WatchServiceEndpoints and a WatchEndpointSlices stream, both from the
//     revision before the pushes;
//  2. pushes 500 Nodes in 3 zones (PushNodeSnapshot), 10,000 single-stack Services
//     with a named target port, and their 100,000 Pods (10 each, on the Nodes round
//     robin), and times from the end of the pushes until each watch shows every
//     Service with all its Pods ready (sync: Endpoints, slices, both);
//  3. flips the readiness of 1,000 Pods a second for 60 s (PushEvents, in order),
//     each changing exactly one Endpoints object and one slice, and times each
//     flip's acknowledgement to the first event on each watch that shows it (p50,
//     p99), and counts the objects written (watch events) against those that changed;
//  4. reads the heap of the whole allocd process, go_memstats_alloc_bytes from its
//     /metrics every second: the lowest after the sync (through the churn and 2 s
//     after it) minus the lowest in the 2 s before the pushes, per Pod;
//
// and prints one table: each figure of each run, the medians and the ceilings, with
// allocd's own view next to the watches' (its CPU seconds, its event → commit
// histograms), the machine's cores, the date, and the load average around each run
// (the machine is shared: other work takes cores from allocd).
//
// With -baseline it alternates runs of two binaries (A, then B, -runs times) and
// prints the medians of each and their ratios A/B. With -profile-dir allocd also
// serves pprof (--pprof-address) and each run saves a CPU profile of the sync and one
// of the churn, and heap profiles after the sync and at the end. `make bench` runs it.
package main
