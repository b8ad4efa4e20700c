// Package fault names the kinds of failure shrooms tells apart — bad input,
// a host not ready, a busy task, a deadline, an interrupt, a usage limit, a history mismatch —
// so the CLI maps exit codes from the kind, never from an error's text.
// A Kind is itself an error (the kind's old sentinel), and Wrap keeps the
// cause: errors.Is and errors.As see through a wrapped error to both.
//
// A kind is decided once: where the fact is known (Wrap, deep down), or
// once per phase for what is left (Default, Phase: a command's failures
// that no callee kinded are the host's, say).
package fault

import (
	"errors"
	"fmt"
)

// Kind is a kind of failure. Its zero value, Internal, is a bug or an
// unexpected failure.
type Kind int

// The kinds.
const (
	Internal Kind = iota
	Input
	HostNotReady
	Busy
	Deadline
	Interrupted
	Limit
	// History is a resumed conversation whose history is not the one the
	// model gateway forwarded before (gateway.NAME.history = "refuse").
	History
)

// Error is the kind's text; wrapped errors print it before their cause.
func (k Kind) Error() string {
	switch k {
	case Input:
		return "bad input"
	case HostNotReady:
		return "host not ready"
	case Busy:
		return "task is busy"
	case Deadline:
		return "deadline exceeded"
	case Interrupted:
		return "interrupted"
	case Limit:
		return "model usage limit reached"
	case History:
		return "conversation history mismatch"
	}
	return "internal error"
}

// kinded is an error of a kind that keeps its cause.
type kinded struct {
	kind Kind
	err  error
}

func (e *kinded) Error() string { return e.kind.Error() + ": " + e.err.Error() }

// Unwrap is the cause, so errors.Is/As reach it.
func (e *kinded) Unwrap() error { return e.err }

// Is makes errors.Is(err, kind) true for the kind it was wrapped with.
func (e *kinded) Is(target error) bool {
	k, ok := target.(Kind)
	return ok && k == e.kind
}

// Wrap marks err as a failure of kind k, keeping err as the cause. A nil
// err stays nil.
func Wrap(k Kind, err error) error {
	if err == nil {
		return nil
	}
	return &kinded{kind: k, err: err}
}

// Default is err as a failure of kind k when it has no kind yet (Of is
// Internal), and err unchanged when a callee already decided its kind: a
// phase kinds its failures once, at its end, instead of at each call. A
// nil err stays nil.
func Default(k Kind, err error) error {
	if err == nil || Of(err) != Internal {
		return err
	}
	return Wrap(k, err)
}

// Phase is Default for a deferred call on a function's named error
// result: `defer fault.Phase(fault.HostNotReady, &err)` makes every
// failure the function returns without a kind one of kind k.
func Phase(k Kind, err *error) { *err = Default(k, *err) }

// Wrapf is Wrap of fmt.Errorf(format, args...) (which may itself wrap).
func Wrapf(k Kind, format string, args ...any) error {
	return Wrap(k, fmt.Errorf(format, args...))
}

// Of is the kind of err: the outermost kind in its chain, or Internal.
func Of(err error) Kind {
	for e := err; e != nil; e = errors.Unwrap(e) {
		switch v := e.(type) {
		case *kinded:
			return v.kind
		case Kind:
			return v
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, w := range j.Unwrap() {
				if k := Of(w); k != Internal {
					return k
				}
			}
			return Internal
		}
	}
	return Internal
}
