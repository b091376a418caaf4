package allocator

import (
	"errors"
	"fmt"

	"github.com/allocd/allocd/internal/badrequest"
)

var (
	// ErrFull is returned when a range has no free address or port left.
	ErrFull = errors.New("range is full")
	// ErrAllocated is the sentinel of AllocatedError.
	ErrAllocated = errors.New("already allocated")
	// ErrNotInRange is the sentinel of NotInRangeError.
	ErrNotInRange = errors.New("not in range")
	// ErrNoRange is returned for an IP family no configured range has.
	ErrNoRange = errors.New("no range of that ip family")
	// ErrConflict is returned when an allocation changed since it was read, or when
	// the retries of a contended transaction ran out.
	ErrConflict = errors.New("conflict: changed since read")
	// ErrNotOwner is the sentinel of NotOwnerError.
	ErrNotOwner = errors.New("held by another owner")
	// ErrNotFound is returned by Get for an item nobody holds.
	ErrNotFound = errors.New("not allocated")
	// ErrInvalid is the sentinel of InvalidError (badrequest's, shared by allocd's
	// packages).
	ErrInvalid = badrequest.ErrInvalid
	// ErrRangesMismatch is the sentinel of RangesMismatchError.
	ErrRangesMismatch = errors.New("configured ranges differ from the ranges recorded in etcd")
	// ErrNotRunning is returned by calls that need the committer while Run is not
	// running (not started yet, or stopped).
	ErrNotRunning = errors.New("allocator is not running")
	// ErrNotSynced is returned by Sync when the index stays behind etcd for longer
	// than a read may wait (the watch is stuck or far behind).
	ErrNotSynced = errors.New("allocation index has not caught up with etcd")
)

// NotInRangeError is an item outside every range of its kind (or in the network or
// broadcast address of its range).
type NotInRangeError struct {
	Item Item
	// Range is the range the item should have been in.
	Range string
}

func (e *NotInRangeError) Error() string {
	return fmt.Sprintf("%s %s is not in the valid range %s", e.Item.Kind, e.Item, e.Range)
}

// Unwrap lets errors.Is(err, ErrNotInRange) match.
func (e *NotInRangeError) Unwrap() error { return ErrNotInRange }

// FullError is a range with no free item left.
type FullError struct {
	// Range is the name of the full range.
	Range string
}

func (e *FullError) Error() string { return "range " + e.Range + " is full" }

// Unwrap lets errors.Is(err, ErrFull) match.
func (e *FullError) Unwrap() error { return ErrFull }

// AllocatedError is a specific item that another owner holds.
type AllocatedError struct {
	Item   Item
	Holder Owner
}

func (e *AllocatedError) Error() string {
	return fmt.Sprintf("%s %s is already allocated to %s", e.Item.Kind, e.Item, e.Holder)
}

// Unwrap lets errors.Is(err, ErrAllocated) match.
func (e *AllocatedError) Unwrap() error { return ErrAllocated }

// NotOwnerError is a Release of an item that another owner holds.
type NotOwnerError struct {
	Item   Item
	Holder Owner
	// Requester is the owner that asked for the release.
	Requester Owner
}

func (e *NotOwnerError) Error() string {
	return fmt.Sprintf("%s %s is held by %s, not by %s", e.Item.Kind, e.Item, e.Holder, e.Requester)
}

// Unwrap lets errors.Is(err, ErrNotOwner) match.
func (e *NotOwnerError) Unwrap() error { return ErrNotOwner }

// InvalidError is a request the allocator refuses before writing anything: too many
// items, duplicates, a policy that contradicts the families. Its violations name the
// request fields as the API spells them.
type InvalidError = badrequest.Error

// RangesMismatchError is returned by New when etcd records other ranges than the
// configured ones: replicas must agree on the ranges.
type RangesMismatchError struct {
	// Key is the etcd key that records the ranges.
	Key string
	// Stored and Configured describe both sets of ranges.
	Stored, Configured string
}

func (e *RangesMismatchError) Error() string {
	return fmt.Sprintf("configured ranges %s differ from the ranges %s recorded in etcd at %s; every replica must be started with the same --service-cluster-ip-range and --service-node-port-range",
		e.Configured, e.Stored, e.Key)
}

// Unwrap lets errors.Is(err, ErrRangesMismatch) match.
func (e *RangesMismatchError) Unwrap() error { return ErrRangesMismatch }
