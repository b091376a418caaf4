// Package endpoints is kube-controller-manager's Endpoints and EndpointSlice
// controllers, over etcd, side by side in one term of leadership: for every Service
// with a selector it keeps the v1 Endpoints object Kubernetes would write (the same
// addresses, readiness, ports, labels and annotations) under
// <prefix>/endpoints/<namespace>/<name>, and its discovery/v1 EndpointSlices under
// <prefix>/endpointslices/<namespace>/<service>/<name>, computed from the Service, Pod
// and Node feeds that an API-server shim pushes (snapshots, then events). The objects
// are package endpoints/kube's types; the slices are planned by package
// endpoints/endpointslice, as upstream's controller has them planned by
// k8s.io/endpointslice. docs/shims/endpoints-controller.md and
// docs/shims/endpointslices.md say where allocd does better or deviates.
//
// # Where things are
//
//   - controller.go: the Controller, its feeds (ApplyServiceSnapshot,
//     ApplyPodSnapshot, ApplyNodeSnapshot, ApplyEvents) and Lead, which runs a term.
//   - term.go: one term of leadership: the feeds' inputs (inputs.go), each
//     controller's queue (queue.go) and workers, the views of what etcd holds
//     (view.go) and the group committer both write through (commit.go).
//   - epterm.go: the Endpoints controller's sync of a Service (its rules: subsets.go,
//     desired.go, pods.go, trigger.go); sliceterm.go: the EndpointSlice controller's;
//     master.go: the Endpoints and slice of default/kubernetes, from the master leases.
//   - codec.go, slicecodec.go: the stored form (the API's messages' encoding);
//     exact.go: when it goes to a watcher as it is; read.go: Get, List and Watch of
//     both kinds, on every replica.
//
// # The Endpoints rules
//
// They are Kubernetes v1.37's, as kube-controller-manager's syncService
// (pkg/controller/endpoint/endpoints_controller.go) and RepackSubsets
// (pkg/api/v1/endpoints/util.go) apply them: Pods selected by the Service's selector
// in its namespace; terminal Pods never, and terminating ones only with
// publishNotReadyAddresses; ready or not ready by the Ready condition (everything
// ready with publishNotReadyAddresses); one address per Pod, of the Service's first IP
// family; the hostname when the Pod's subdomain is the Service's name; named target
// ports resolved by name and protocol in containers, then sidecars; the subsets
// repacked into a canonical form; the Service's labels, the headless and managed-by
// labels; the trigger-time annotation; at most 1,000 addresses with the over-capacity
// annotation; no write when nothing changed.
//
// Where allocd deviates from Kubernetes on purpose (each a problem Kubernetes' users
// reported):
//
//   - No stale-cache freeze: a write is a compare-and-swap on the object's etcd
//     revision, and the comparison is against what the term last saw committed (its
//     own writes, and others' through a watch), never against a lagging cache.
//   - A truncated object is compared after truncation, so it is not rewritten on every
//     sync.
//   - Only objects this controller wrote (ServiceUID and ManagedBy set) are deleted when
//     their Service is gone; hand-made Endpoints of a Service without selector, and
//     objects without a Service that allocd never wrote, are left alone (#76164).
//   - The start-up sweep runs only once the term has a complete Service snapshot.
//   - A Service that becomes ExternalName loses the Endpoints this controller wrote
//     (Kubernetes leaves them, #105986).
//   - A failing sync is retried with backoff (5 ms doubling up to 5 s) while the term
//     lasts, never dropped after 15 tries.
//
// # Leadership
//
// One replica writes: the leader elected by package leader, for one term at a time
// (its leader.Elector runs Lead). Every write is a transaction that also compares the
// election key's CreateRevision, so a deposed leader can never write after its
// successor. Each controller writes nothing before it has the snapshots of its feeds,
// pushed during the term: the Endpoints controller a Service and a Pod snapshot, the
// EndpointSlice controller a Node snapshot too. An event of a feed without a snapshot
// in the term is refused (SnapshotRequiredError), which tells the feeder to push its
// snapshots again. Reads (Get, List, Watch, ListSlices, WatchSlices) are served by
// every replica from etcd.
//
//	c, _ := endpoints.New(cli, endpoints.Config{Prefix: "/allocd"})
//	go el.Run(ctx, c.Lead) // el is the replica's *leader.Elector
//	c.ApplyServiceSnapshot(ctx, rev, services)
//	c.ApplyPodSnapshot(ctx, rev, pods)
//	c.ApplyNodeSnapshot(ctx, rev, nodes)
//	c.ApplyEvents(ctx, []endpoints.Event{{Type: endpoints.Upsert, Revision: rev + 1, Pod: pod}})
//	e, _ := c.Get(ctx, "default", "web")
package endpoints
