package repair

import (
	"errors"
	"fmt"

	"github.com/allocd/allocd/internal/badrequest"
	"github.com/allocd/allocd/leader"
)

var (
	// ErrStaleSnapshot is the sentinel of StaleSnapshotError.
	ErrStaleSnapshot = errors.New("snapshot is older than the last one accepted")
	// ErrNoSnapshot is returned by a pass when no snapshot was pushed and no snapshot
	// file is configured.
	ErrNoSnapshot = errors.New("no service snapshot: push one or set --service-snapshot-file")
	// ErrNotLeader is the sentinel of the *leader.NotLeaderError of a call only the
	// leader serves.
	ErrNotLeader = leader.ErrNotLeader
	// ErrInvalidSnapshot is the sentinel of InvalidSnapshotError (badrequest's, shared
	// by allocd's packages).
	ErrInvalidSnapshot = badrequest.ErrInvalid
	// ErrSnapshotFile is the sentinel of SnapshotFileError.
	ErrSnapshotFile = errors.New("bad service snapshot file")
)

// StaleSnapshotError refuses a snapshot whose revision is below the last revision
// accepted (by any replica: the accepted revision is recorded in etcd).
type StaleSnapshotError struct {
	// Revision of the refused snapshot.
	Revision int64
	// Accepted is the last revision accepted.
	Accepted int64
}

// Error names both revisions.
func (e *StaleSnapshotError) Error() string {
	return fmt.Sprintf("snapshot revision %d is older than the last accepted revision %d", e.Revision,
		e.Accepted)
}

// Unwrap lets errors.Is(err, ErrStaleSnapshot) match.
func (e *StaleSnapshotError) Unwrap() error { return ErrStaleSnapshot }

// InvalidSnapshotError lists what is wrong with a snapshot (at most
// badrequest.MaxViolations; More counts the rest), each field named as in the proto
// (snapshot.services[3].uid).
type InvalidSnapshotError = badrequest.Error

// SnapshotFileError is a --service-snapshot-file that cannot be read, parsed or
// accepted. It is not the caller's bad input: a RunRepair that meets it fails with
// FAILED_PRECONDITION.
type SnapshotFileError struct {
	Path string
	Err  error
}

// Error names the file and the cause.
func (e *SnapshotFileError) Error() string {
	return "service snapshot file " + e.Path + ": " + e.Err.Error()
}

// Unwrap lets errors.Is(err, ErrSnapshotFile) match, and reaches the cause.
func (e *SnapshotFileError) Unwrap() []error { return []error{ErrSnapshotFile, e.Err} }
