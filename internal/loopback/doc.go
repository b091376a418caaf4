// Package loopback hands tests and test setups addresses to listen on.
//
//	addr, err := loopback.FreeAddr() // "127.83.4.17:41234"
//	if err != nil { ... }
//	lis, err := net.Listen("tcp", addr)
package loopback
