// Package fault runs allocd the way it is deployed, on loopback, and breaks it: a
// 3-member etcd cluster and 3 allocd replicas, each a process of its own (etcd members
// through cmd etcdmember, allocd through its binary), every allocd reaching every etcd
// member through a proxy on loopback (internal/testing/netproxy) that can delay, hold (a partition)
// and reset.
// TestFaultSuite drives clients against it while faults are injected on a schedule and
// checks the recorded history and the final state in etcd.
//
//	ALLOCD_FAULT_TESTS=1 ALLOCD_FAULT_DURATION=5m go test -run TestFaultSuite ./internal/testing/fault/
package fault
