// Package leakcheck fails a package's tests when goroutines outlive them: every
// package's TestMain calls MustTestMain, as etcd's do MustTestMainWithLeakDetection.
// A goroutine that allocd started and nobody waits for is a bug; the only goroutines
// let through are those of libraries that outlive a test by design, each named in
// ignored with the reason.
//
//	func TestMain(m *testing.M) { leakcheck.MustTestMain(m) }
package leakcheck
