package daemon

import (
	"errors"
	"fmt"
)

// Why a flag is refused: the Kind of a *FlagError, for errors.Is.
var (
	// ErrFlagValue is a flag value allocd cannot run with: not a CIDR, out of its range,
	// an unknown name, a file that cannot be used (Cause says why).
	ErrFlagValue = errors.New("bad flag value")
	// ErrFlagsTogether is one of two flags that go together given without the other.
	ErrFlagsTogether = errors.New("flags go together")
	// ErrFlagNeeds is a flag given without the flags it needs.
	ErrFlagNeeds = errors.New("flag needs others")
	// ErrFlagConflict is a flag that does not go with another one given: TLS files with
	// an http:// etcd, --quota-backend-bytes with an etcd that allocd does not run.
	ErrFlagConflict = errors.New("flags conflict")
)

// FlagError is a flag that allocd refuses, alone or with others. Its message is the
// whole sentence an operator reads; errors.Is finds its Kind and its Cause.
type FlagError struct {
	// Flags are the flags the refusal is about, as the command line spells them, the
	// one at fault first.
	Flags []string
	// Kind is why: ErrFlagValue, ErrFlagsTogether, ErrFlagNeeds or ErrFlagConflict.
	Kind error
	// Cause is the error behind the refusal, if any: a file that cannot be read.
	Cause error
	msg   string
}

// Error returns the sentence: the flags, their values and what to do.
func (e *FlagError) Error() string { return e.msg }

// Unwrap lets errors.Is and errors.As reach the Kind and the Cause.
func (e *FlagError) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Cause}
}

// flagError returns a *FlagError of kind about flags, whose message is format over
// args; an error args wrap with %w is its Cause.
func flagError(kind error, flags []string, format string, args ...any) *FlagError {
	err := fmt.Errorf(format, args...)
	return &FlagError{Flags: flags, Kind: kind, Cause: errors.Unwrap(err), msg: err.Error()}
}

// badValue is the *FlagError of the value of flag, whose message is format over args.
func badValue(flag, format string, args ...any) *FlagError {
	return flagError(ErrFlagValue, []string{flag}, format, args...)
}
