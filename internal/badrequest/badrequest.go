package badrequest

import (
	"errors"
	"strconv"
	"strings"
)

// ErrInvalid is the sentinel of *Error: errors.Is(err, ErrInvalid) matches every one.
var ErrInvalid = errors.New("invalid argument")

// MaxViolations bounds the violations an Error lists; More counts the rest.
const MaxViolations = 16

// FieldViolation is one bad field, as google.rpc.BadRequest.FieldViolation.
type FieldViolation struct {
	// Field is the path of the field in the request, as the proto spells it.
	Field string
	// Description says what is wrong with it.
	Description string
}

// Error is a request that fails validation: one violation per bad field.
type Error struct {
	// What names the request in the message ("invalid service snapshot"); "" for
	// none.
	What       string
	Violations []FieldViolation
	// More counts the violations left out after MaxViolations.
	More int
}

// New returns an Error of one violation.
func New(field, description string) *Error {
	return &Error{Violations: []FieldViolation{{Field: field, Description: description}}}
}

// Add records a violation (or counts it in More past MaxViolations) and returns e, so
// that validation can collect every bad field.
func (e *Error) Add(field, description string) *Error {
	if len(e.Violations) < MaxViolations {
		e.Violations = append(e.Violations, FieldViolation{Field: field, Description: description})
	} else {
		e.More++
	}
	return e
}

// OrNil returns nil when e holds no violation, else e.
func (e *Error) OrNil() error {
	if e == nil || len(e.Violations) == 0 {
		return nil
	}
	return e
}

// Error returns "what: field: description; field: description; and N more".
func (e *Error) Error() string {
	var sb strings.Builder
	if e.What != "" {
		sb.WriteString(e.What)
		sb.WriteString(": ")
	}
	if len(e.Violations) == 0 {
		sb.WriteString("invalid argument")
	}
	for i, v := range e.Violations {
		if i > 0 {
			sb.WriteString("; ")
		}
		sb.WriteString(v.Field + ": " + v.Description)
	}
	if e.More > 0 {
		sb.WriteString("; and " + strconv.Itoa(e.More) + " more")
	}
	return sb.String()
}

// Unwrap lets errors.Is(err, ErrInvalid) match.
func (e *Error) Unwrap() error { return ErrInvalid }
