package masterlease

import (
	"errors"
	"strings"
)

var (
	// ErrInvalid is the sentinel of InvalidError: a bad IP or TTL in a request.
	ErrInvalid = errors.New("invalid master lease request")
	// ErrNotReady is returned while the Manager cannot answer from a state that is
	// current: Run has not loaded the leases yet, has stopped, or its watch lags etcd
	// for longer than a read may wait.
	ErrNotReady = errors.New("master lease state not ready")
	// ErrConflict is returned when a lease key kept changing under a Renew or Remove
	// (other replicas writing the same key) for more attempts than allowed.
	ErrConflict = errors.New("master lease changed concurrently; retries exhausted")
)

// FieldViolation is one bad field of a request, named as in the proto
// (allocd.v1.RenewRequest / RemoveLeaseRequest).
type FieldViolation struct {
	// Field is the proto field name: "ip" or "ttl_seconds".
	Field string
	// Description says what is wrong with it.
	Description string
}

// InvalidError is a request that fails validation, with one violation per bad field.
// Nothing was written to etcd for it.
type InvalidError struct {
	Violations []FieldViolation
}

func (e *InvalidError) add(field, description string) {
	e.Violations = append(e.Violations, FieldViolation{Field: field, Description: description})
}

func (e *InvalidError) orNil() error {
	if len(e.Violations) == 0 {
		return nil
	}
	return e
}

func (e *InvalidError) Error() string {
	parts := make([]string, 0, len(e.Violations))
	for _, v := range e.Violations {
		parts = append(parts, v.Field+": "+v.Description)
	}
	return "invalid master lease request: " + strings.Join(parts, "; ")
}

// Unwrap lets errors.Is(err, ErrInvalid) match.
func (e *InvalidError) Unwrap() error { return ErrInvalid }
