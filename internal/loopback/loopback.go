package loopback

import (
	"math/rand/v2"
	"net"
	"net/netip"
)

// FreeAddr returns a host:port on loopback that was free a moment ago, for a listener
// that is opened later (an etcd member, an allocd started by a test).
//
// The host is a random address of 127.0.0.0/8, not 127.0.0.1: outgoing connections on
// loopback take their ephemeral ports from 127.0.0.1, and so do other tests' listeners,
// so a port found free there can be taken before it is used (the "address already in
// use" of a busy machine). Where only 127.0.0.1 is configured (macOS), it is used.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(randomHost(), "0"))
	if err != nil {
		if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return "", err
		}
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// randomHost is an address of 127.0.0.0/8 other than 127.0.0.0/16's.
func randomHost() string {
	a := netip.AddrFrom4([4]byte{127, byte(1 + rand.IntN(254)), byte(rand.IntN(256)),
		byte(1 + rand.IntN(254))})
	return a.String()
}
