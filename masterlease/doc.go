// Package masterlease owns the master leases of the API-server replicas (the
// /masterleases TTL keys of kube-apiserver's lease endpoint reconciler) and the
// Endpoints of the default/kubernetes Service that follow from them.
//
// A lease is the etcd key <prefix><ip> (ip canonical) bound to its own etcd lease. Renew
// keeps that lease alive, or, for a new key or a new TTL, moves the key to a fresh lease
// and revokes the old one: one etcd lease per key, whatever the number of renewals. A
// lease that is not renewed is revoked by etcd and its key deleted with it, so it leaves
// List and the endpoints within its TTL plus etcd's expiry tick (500 ms) and the watch
// delay. Remove deletes the key and revokes the lease, and marks the address removed
// (<prefix>removed/<ip>, until the next Renew creates the key).
//
// etcd can delete a key whose lease is renewed in time: an etcd leader that was
// stopped and resumes revokes the leases its own clock says expired, before it learns
// that another leads (restore.go). Run tells such a delete from an expiry by the last
// renewal's time in the key's previous value, from a Remove by the marker (or the
// shutdown key), and from a delete by hand by its etcd lease, which lives on; it keeps
// the lease in the endpoints and in List, and writes the key again under a new lease
// of the TTL that was left, within milliseconds.
//
// Run watches the prefix and derives the endpoints: one subset, the addresses sorted
// (netip order), port "https"/TCP. When storage lists no lease at all, the last
// non-empty endpoints are kept and a warning is logged (kube-apiserver's "refusing to
// erase all endpoints"), unless the last lease was removed by Remove with shutdown set:
// the last API server shutting down cleanly (kubernetes #115804). That is signalled to
// every replica through the key <prefix>shutdown, written in the transaction of the
// delete. The guard's memory is the process's: a replica that starts while storage
// lists no lease publishes no addresses.
//
//	m, err := masterlease.New(ctx, cli, masterlease.Config{
//		Prefix:     "/allocd/masterleases/",
//		DefaultTTL: 15 * time.Second,
//		Logger:     log,
//	})
//	if err != nil {
//		return err
//	}
//	g.Go(func() error { return m.Run(ctx) }) // an errgroup owns Run
//	l, err := m.Renew(ctx, "10.0.0.1", 0)     // 0: the default TTL
//	eps, err := m.Endpoints(ctx)              // [10.0.0.1] port 6443
package masterlease
