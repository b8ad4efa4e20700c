package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Size is a byte count written as a number with an optional k, m, g or t
// suffix (powers of 1024), e.g. "512m".
type Size int64

// UnmarshalText parses "512m", "4g", "1024".
func (s *Size) UnmarshalText(b []byte) error {
	v, err := ParseSize(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// MarshalText writes the size in the largest exact unit.
func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

func (s Size) String() string {
	units := []string{"t", "g", "m", "k"}
	for i, u := range units {
		f := int64(1) << (10 * (4 - i))
		if s != 0 && int64(s)%f == 0 {
			return fmt.Sprintf("%d%s", int64(s)/f, u)
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

// ParseSize parses a size such as "512m".
func ParseSize(text string) (Size, error) {
	t := strings.ToLower(strings.TrimSpace(text))
	t = strings.TrimSuffix(t, "b")
	shift := 0
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k':
			shift = 10
		case 'm':
			shift = 20
		case 'g':
			shift = 30
		case 't':
			shift = 40
		}
		if shift > 0 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 || (shift > 0 && v > (1<<(63-shift))-1) {
		return 0, fmt.Errorf("%q is not a size (use a whole number with k, m, g or t, e.g. 512m)", text)
	}
	return Size(v << shift), nil
}

// Duration is a time.Duration written as "90s", "30m", "2h".
type Duration time.Duration

// UnmarshalText parses a Go duration.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration (e.g. 90s, 30m, 2h)", string(b))
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes the duration as Go prints it.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// Std returns the time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }
