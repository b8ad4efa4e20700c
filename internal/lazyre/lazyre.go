// Package lazyre compiles a regular expression on its first use instead of
// at process start: package-level regexp.MustCompile calls run in every
// shrooms command's init, and a pattern with a counted repetition
// ({0,512}) costs a millisecond or more to compile.
package lazyre

import (
	"regexp"
	"sync"
)

// New returns a function that compiles expr once, on its first call, and
// then returns the same *regexp.Regexp. A bad pattern panics on that call,
// as regexp.MustCompile would at init.
func New(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}
