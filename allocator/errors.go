package allocator

import (
	"errors"
	"fmt"
	"strings"

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

// Error names the item and the range it is not in.
func (e *NotInRangeError) Error() string {
	return fmt.Sprintf("%s %s is not in the valid range %s", e.Item.Kind, e.Item, e.Range)
}

// Unwrap lets errors.Is(err, ErrNotInRange) match.
func (e *NotInRangeError) Unwrap() error { return ErrNotInRange }

// FullError is a range with no free item left.
type FullError struct {
	// Range is the name of the full range (for ClusterIPs, the ready ranges of the
	// family, with the ServiceCIDRs they belong to).
	Range string
	// Hint says what to do, if anything.
	Hint string
}

// Error names the full range, and says what to do when there is a hint.
func (e *FullError) Error() string {
	if e.Hint != "" {
		return "range " + e.Range + " is full; " + e.Hint
	}
	return "range " + e.Range + " is full"
}

// Unwrap lets errors.Is(err, ErrFull) match.
func (e *FullError) Unwrap() error { return ErrFull }

// AllocatedError is a specific item that another owner holds.
type AllocatedError struct {
	Item   Item
	Holder Owner
}

// Error names the item and its holder.
func (e *AllocatedError) Error() string {
	return fmt.Sprintf("%s %s is already allocated to %s", e.Item.Kind, e.Item, e.Holder)
}

// Unwrap lets errors.Is(err, ErrAllocated) match.
func (e *AllocatedError) Unwrap() error { return ErrAllocated }

// NotOwnerError is a Release of an item that another owner holds, or a Transfer of an
// item that its from owner does not hold (another owner does, or nobody: Free).
type NotOwnerError struct {
	Item   Item
	Holder Owner
	// Requester is the owner that asked for the release, or the from of a transfer.
	Requester Owner
	// Free is set when nobody holds the item (Holder is then empty).
	Free bool
	// Hint says what to do, if anything ("set force to release it anyway").
	Hint string
}

// Error names the item, its holder (or says it is free) and the requester.
func (e *NotOwnerError) Error() string {
	if e.Free {
		return fmt.Sprintf("%s %s is free, not held by %s", e.Item.Kind, e.Item, e.Requester)
	}
	return fmt.Sprintf("%s %s is held by %s, not by %s", e.Item.Kind, e.Item, e.Holder, e.Requester)
}

// Unwrap lets errors.Is(err, ErrNotOwner) match.
func (e *NotOwnerError) Unwrap() error { return ErrNotOwner }

// InvalidError is a request the allocator refuses before writing anything: too many
// items, duplicates, a policy that contradicts the families. Its violations name the
// request fields as the API spells them.
type InvalidError = badrequest.Error

// RangesMismatchError is returned by New when etcd records another node port range
// than the configured one: replicas must agree on it. (ClusterIP ranges live in
// ServiceCIDRs, which flags only seed.)
type RangesMismatchError struct {
	// Key is the etcd key that records the ranges.
	Key string
	// Stored and Configured describe both sets of ranges.
	Stored, Configured string
}

// Error names both sets of ranges and the flag every replica must agree on.
func (e *RangesMismatchError) Error() string {
	return fmt.Sprintf("configured ranges %s differ from the ranges %s recorded in etcd at %s; every "+
		"replica must be started with the same --service-node-port-range",
		e.Configured, e.Stored, e.Key)
}

// Unwrap lets errors.Is(err, ErrRangesMismatch) match.
func (e *RangesMismatchError) Unwrap() error { return ErrRangesMismatch }

// ErrCIDRExists is the sentinel of CIDRExistsError.
var ErrCIDRExists = errors.New("ServiceCIDR exists")

// CIDRExistsError is a CreateServiceCIDR of a name in use.
type CIDRExistsError struct{ Name string }

// Error names the ServiceCIDR and says what to do.
func (e *CIDRExistsError) Error() string {
	return fmt.Sprintf("ServiceCIDR %q already exists; pick another name, or delete it first", e.Name)
}

// Unwrap lets errors.Is(err, ErrCIDRExists) match.
func (e *CIDRExistsError) Unwrap() error { return ErrCIDRExists }

// ErrCIDRNotFound is the sentinel of CIDRNotFoundError.
var ErrCIDRNotFound = errors.New("no such ServiceCIDR")

// CIDRNotFoundError is a ServiceCIDR name that etcd does not hold (never created, or
// removed after its deletion).
type CIDRNotFoundError struct{ Name string }

// Error names the ServiceCIDR.
func (e *CIDRNotFoundError) Error() string { return fmt.Sprintf("ServiceCIDR %q not found", e.Name) }

// Unwrap lets errors.Is(err, ErrCIDRNotFound) match.
func (e *CIDRNotFoundError) Unwrap() error { return ErrCIDRNotFound }

// ErrTerminating is the sentinel of TerminatingError.
var ErrTerminating = errors.New("only in terminating ServiceCIDRs")

// TerminatingError is a specific address that lies only in ServiceCIDRs being
// deleted: nothing new is allocated there.
type TerminatingError struct {
	Item Item
	// CIDRs are the terminating ranges that hold it.
	CIDRs []string
}

// Error names the address and the terminating ServiceCIDRs that hold it.
func (e *TerminatingError) Error() string {
	return fmt.Sprintf("%s %s lies only in %s, which is terminating: nothing new is allocated there; ask "+
		"for an address of a ready ServiceCIDR",
		e.Item.Kind, e.Item, strings.Join(e.CIDRs, ", "))
}

// Unwrap lets errors.Is(err, ErrTerminating) match.
func (e *TerminatingError) Unwrap() error { return ErrTerminating }

// rangesChangedError fails an op whose transaction found a ServiceCIDR it drew from
// changed (deleted, or removed): the caller waits for the index to reach rev and
// plans again.
type rangesChangedError struct{ rev int64 }

func (e *rangesChangedError) Error() string {
	return fmt.Sprintf("a ServiceCIDR changed at revision %d: %v", e.rev, ErrConflict)
}

func (e *rangesChangedError) Unwrap() error { return ErrConflict }
