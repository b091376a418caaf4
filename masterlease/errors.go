package masterlease

import (
	"errors"

	"github.com/allocd/allocd/internal/badrequest"
)

var (
	// ErrInvalid is the sentinel of InvalidError: a bad IP or TTL in a request
	// (badrequest's, shared by allocd's packages).
	ErrInvalid = badrequest.ErrInvalid
	// ErrNotReady is returned while the Manager cannot answer from a state that is
	// current: Run has not loaded the leases yet, has stopped, or its watch lags etcd
	// for longer than a read may wait.
	ErrNotReady = errors.New("master lease state not ready")
	// ErrConflict is returned when a lease key kept changing under a Renew or Remove
	// (other replicas writing the same key) for more attempts than allowed.
	ErrConflict = errors.New("master lease changed concurrently; retries exhausted")
)

// InvalidError is a request that fails validation, with one violation per bad field,
// named as in the proto (allocd.v1.RenewRequest / RemoveLeaseRequest): "ip" or
// "ttl_seconds". Nothing was written to etcd for it.
type InvalidError = badrequest.Error

// invalidRequest returns an empty InvalidError of a master lease request.
func invalidRequest() *InvalidError { return &InvalidError{What: "invalid master lease request"} }
