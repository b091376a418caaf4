// Package embedded starts a single-member etcd inside the allocd process: the
// daemon's default when no --etcd-servers is given, and the etcd of every test
// (through package etcdtest).
//
//	e, err := embedded.Start(ctx, embedded.Config{Dir: "/var/lib/allocd",
//		ClientURL: "http://127.0.0.1:2379", PeerURL: "http://127.0.0.1:2380"})
//	if err != nil { ... }
//	defer e.Close()
package embedded
