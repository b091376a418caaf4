// Command etcdmember runs one member of an etcd cluster as a process of its own, so
// that the fault suite can kill it with SIGKILL, pause it with SIGSTOP and restart it
// on its data. It is etcd's embed package behind a few flags, fsync on:
//
//	etcdmember -name m0 -data-dir /tmp/m0 -client-url http://127.0.0.1:2379 \
//		-peer-url http://127.0.0.1:2380 -initial-cluster m0=http://127.0.0.1:2380,... -token t
package main
