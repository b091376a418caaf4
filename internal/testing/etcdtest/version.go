package etcdtest

import (
	"context"
	"fmt"
	"time"
)

// Version is the etcd server version the member reports (its Status): go.mod's etcd
// when embedded, the binary's with binaryEnv.
func (s *Server) Version() string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.Client.Status(ctx, s.Endpoint)
	if err != nil {
		s.t.Fatalf("etcd status of %s: %v", s.Endpoint, err)
	}
	return st.Version
}

// VersionAtLeast reports whether the member's etcd is major.minor or newer: for tests
// of what only newer servers have (RangeStream came with 3.7).
func (s *Server) VersionAtLeast(major, minor int) bool {
	s.t.Helper()
	var ma, mi int
	if _, err := fmt.Sscanf(s.Version(), "%d.%d", &ma, &mi); err != nil {
		s.t.Fatalf("etcd version %q: %v", s.Version(), err)
	}
	return ma > major || ma == major && mi >= minor
}
