package lazyre

import "testing"

func TestNewCompilesOnceOnFirstUse(t *testing.T) {
	re := New(`^a{1,3}$`)
	if !re().MatchString("aaa") || re().MatchString("aaaa") {
		t.Fatal("pattern does not match as regexp would")
	}
	if re() != re() {
		t.Fatal("compiled more than once")
	}
}

func TestNewBadPatternPanicsOnUse(t *testing.T) {
	re := New(`(`) // must not panic here
	defer func() {
		if recover() == nil {
			t.Fatal("a bad pattern did not panic on first use")
		}
	}()
	re()
}
