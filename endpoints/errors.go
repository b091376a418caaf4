package endpoints

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/allocd/allocd/internal/badrequest"

	"github.com/allocd/allocd/leader"
)

// Sentinels of the package.
var (
	// ErrNotFound: no Endpoints object of that name.
	ErrNotFound = errors.New("endpoints not found")
	// ErrNotLeader: this replica does not lead (or its term ended); feeds go to the
	// leader. The *leader.NotLeaderError of the feeds wraps it.
	ErrNotLeader = leader.ErrNotLeader
	// ErrSnapshotRequired: an event of a kind of which this term has no snapshot yet.
	// SnapshotRequiredError wraps it.
	ErrSnapshotRequired = errors.New("snapshot required")
	// ErrStaleSnapshot: a snapshot older than what this term applied. StaleSnapshotError
	// wraps it.
	ErrStaleSnapshot = errors.New("stale snapshot")
	// ErrCompacted: a watch from a revision etcd has compacted away. CompactedError
	// wraps it.
	ErrCompacted = errors.New("revision compacted")
	// ErrInvalid: a malformed feed or request. InvalidError wraps it.
	ErrInvalid = badrequest.ErrInvalid
	// ErrNotReady: the controller's reads are not available yet (or any more).
	ErrNotReady = errors.New("endpoints controller not ready")
)

// Kind names the kind of a feed.
type Kind string

// The kinds of feeds.
const (
	// KindService is the feed of Services.
	KindService Kind = "Service"
	// KindPod is the feed of Pods.
	KindPod Kind = "Pod"
	// KindNode is the feed of Nodes.
	KindNode Kind = "Node"
)

// SnapshotRequiredError is an event of Kind before any snapshot of that kind in the
// leader's current term.
type SnapshotRequiredError struct {
	Kind Kind
}

// Error names the kind of snapshot to push first.
func (e *SnapshotRequiredError) Error() string {
	return "no " + string(e.Kind) + " snapshot in this term of leadership: push a " + string(e.Kind) +
		" snapshot before " + string(e.Kind) + " events"
}

// Unwrap returns ErrSnapshotRequired.
func (e *SnapshotRequiredError) Unwrap() error { return ErrSnapshotRequired }

// StaleSnapshotError is a snapshot older than the revision applied for its kind.
type StaleSnapshotError struct {
	Kind              Kind
	Revision, Applied int64
}

// Error names both revisions.
func (e *StaleSnapshotError) Error() string {
	return fmt.Sprintf("%s snapshot revision %d is older than the revision %d already applied", e.Kind,
		e.Revision, e.Applied)
}

// Unwrap returns ErrStaleSnapshot.
func (e *StaleSnapshotError) Unwrap() error { return ErrStaleSnapshot }

// CompactedError is a watch from a revision etcd no longer has.
type CompactedError struct {
	// Revision asked for, and the oldest revision etcd still has (0 when unknown).
	Revision, Compacted int64
}

// Error names the revision and says what to do.
func (e *CompactedError) Error() string {
	s := "revision " + strconv.FormatInt(e.Revision, 10) + " has been compacted"
	if e.Compacted > 0 {
		s += " (oldest available " + strconv.FormatInt(e.Compacted, 10) + ")"
	}
	return s + ": list again and watch from the list's revision"
}

// Unwrap returns ErrCompacted.
func (e *CompactedError) Unwrap() error { return ErrCompacted }

// InvalidError is a malformed feed or request: one violation per bad field (the first
// badrequest.MaxViolations; More counts the rest).
type InvalidError = badrequest.Error

// violation is one bad field.
type violation = badrequest.FieldViolation
