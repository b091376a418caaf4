package kube

import (
	"net/netip"
	"strconv"
	"strings"
)

// parseIPSloppy parses an IP as Kubernetes' ParseIPSloppy (k8s.io/utils/net): IPv4
// octets with leading zeros are decimal, and an IPv4-mapped IPv6 address is IPv4.
func parseIPSloppy(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err == nil {
		return a.Unmap(), true
	}
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, false
	}
	var b [4]byte
	for i, p := range parts {
		if p == "" || len(p) > 3 {
			return netip.Addr{}, false
		}
		n, err := strconv.Atoi(p)
		if err != nil || n > 255 {
			return netip.Addr{}, false
		}
		b[i] = byte(n)
	}
	return netip.AddrFrom4(b), true
}

// CanonicalIP returns s as Kubernetes publishes it (ParseIPSloppy(s).String()): IPv6
// compressed, IPv4 without leading zeros. ok is false when s is not an IP.
func CanonicalIP(s string) (string, bool) {
	a, ok := parseIPSloppy(s)
	if !ok {
		return "", false
	}
	return a.String(), true
}

// IsIPv6 reports whether s is an IPv6 address (utilnet.IsIPv6String: an unparseable
// string is not).
func IsIPv6(s string) bool {
	a, ok := parseIPSloppy(s)
	return ok && a.Is6()
}
