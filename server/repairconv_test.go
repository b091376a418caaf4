package server

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/repair"
)

// FuzzSnapshotFile feeds arbitrary bytes to the file parser and the validation: they
// must never panic, and an accepted snapshot keeps every Service and the revision.
func FuzzSnapshotFile(f *testing.F) {
	f.Add([]byte(`{"revision": "1", "services": []}`))
	f.Add([]byte(`{"revision": "12", "services": [{"namespace": "ns", "name": "a", "uid": "u",
		"clusterIps": ["10.0.0.1", "None", ""], "nodePorts": [{"port": 30001, "protocol": "UDP"}],
		"healthCheckNodePort": 30002}]}`))
	f.Add([]byte(`{"revision": "-1"}`))
	f.Add([]byte(`{"services": [{}, {}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p allocdv1.ServiceSnapshot
		if err := protojson.Unmarshal(b, &p); err != nil {
			return
		}
		s := serviceSnapshotFromProto(&p)
		if err := s.Validate(); err != nil {
			var inv *repair.InvalidSnapshotError
			if !errors.As(err, &inv) || len(inv.Violations) == 0 {
				t.Fatalf("Validate() = %v; want an InvalidSnapshotError with violations", err)
			}
			return
		}
		if len(s.Services) != len(p.GetServices()) || s.Revision != p.GetRevision() {
			t.Fatalf("serviceSnapshotFromProto: %d services, revision %d; want %d, %d",
				len(s.Services), s.Revision, len(p.GetServices()), p.GetRevision())
		}
	})
}
