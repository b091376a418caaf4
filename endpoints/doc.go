// Package endpoints is kube-controller-manager's Endpoints and EndpointSlice
// controllers, over etcd, side by side in one term of leadership: for every Service
// with a selector it keeps the v1 Endpoints object Kubernetes would write (the same
// addresses, readiness, ports, labels and annotations) under
// <prefix>/endpoints/<namespace>/<name>, and its discovery/v1 EndpointSlices under
// <prefix>/endpointslices/<namespace>/<service>/<name>, computed from the Service, Pod
// and Node feeds that an API-server shim pushes (snapshots, then events). The slice
// reconciler (slicereconcile.go: placement into slices of at most
// Config.MaxEndpointsPerSlice) and hints (slicehints.go) follow k8s.io/endpointslice;
// docs/shims/endpointslices.md says where allocd does better or deviates.
//
// The Endpoints rules follow.
//
// The rules are Kubernetes v1.37's, listed one by one in shared/reference/endpoints.md:
// Pods selected by the Service's selector in its namespace; terminal Pods never, and
// terminating ones only with publishNotReadyAddresses; ready or not ready by the Ready
// condition (everything ready with publishNotReadyAddresses); one address per Pod, of
// the Service's first IP family; the hostname when the Pod's subdomain is the
// Service's name; named target ports resolved by name and protocol in containers, then
// sidecars; the subsets repacked into a canonical form; the Service's labels, the
// headless and managed-by labels; the trigger-time annotation; at most 1,000 addresses
// with the over-capacity annotation; no write when nothing changed.
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
// (its leader.Elector runs Lead). Every write is a transaction that also compares the election key's
// CreateRevision, so a deposed leader can never write after its successor. A term
// writes nothing before it has a snapshot of both kinds pushed during the term; events
// before that are refused (SnapshotRequiredError), which tells the feeder to push
// snapshots again. Reads (Get, List, Watch) are served by every replica from etcd.
//
//	c, _ := endpoints.New(cli, endpoints.Config{Prefix: "/allocd"})
//	go el.Run(ctx, c.Lead) // el is the replica's *leader.Elector
//	c.ApplyServiceSnapshot(ctx, rev, services)
//	c.ApplyPodSnapshot(ctx, rev, pods)
//	c.ApplyEvents(ctx, []endpoints.Event{{Type: endpoints.Upsert, Revision: rev + 1, Pod: pod}})
//	e, _ := c.Get(ctx, "default", "web")
package endpoints
