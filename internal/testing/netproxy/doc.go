// Package netproxy is a TCP proxy for tests that breaks the link it carries: it holds
// the bytes of one direction (a partition that drops nothing), delays them, or drops
// every connection at once. It does for allocd's tests what etcd's pkg/proxy does for
// etcd's, with the subset of that proxy's methods they use and the same effect on data
// in flight, but it listens on loopback only: on 127.0.0.1 or the host it is given,
// never on every interface (etcd's listens on ":port", so a port held on any interface
// by another process fails it).
//
// Tx is the direction from the client toward the target, Rx the way back.
//
//	px, err := netproxy.Listen("127.0.0.1:0", etcdAddr)
//	if err != nil { ... }
//	defer px.Close()
//	cli := connect("http://" + px.Addr())
//	px.PauseTx() // requests are held from here on
//	...
//	px.UnpauseTx() // and reach etcd now, in order
package netproxy
