package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Time is a timestamp that decodes from an RFC 3339 string or from Unix
// seconds (integer or fractional), and encodes as RFC 3339 with nanoseconds
// in UTC.
type Time struct{ time.Time }

// MarshalJSON implements json.Marshaler.
func (t Time) MarshalJSON() ([]byte, error) {
	return []byte(`"` + t.UTC().Format(time.RFC3339Nano) + `"`), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (t *Time) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := ParseTime(s)
		if err != nil {
			return err
		}
		t.Time = v
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("want RFC 3339 time or Unix seconds, got %s", truncate(string(b), 32))
	}
	v, err := UnixSeconds(f)
	if err != nil {
		return err
	}
	t.Time = v
	return nil
}

// ParseTime parses RFC 3339 or a decimal number of Unix seconds.
func ParseTime(s string) (time.Time, error) {
	if v, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return v.UTC(), nil
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return UnixSeconds(f)
	}
	return time.Time{}, fmt.Errorf("want RFC 3339 time or Unix seconds, got %q", truncate(s, 40))
}

// UnixSeconds converts Unix seconds to a time, refusing values outside
// years 1970–9999 and non-finite values.
func UnixSeconds(f float64) (time.Time, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 253402300799 {
		return time.Time{}, fmt.Errorf("unix seconds %v out of range", f)
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC(), nil
}

// T wraps a time.Time as a *Time.
func T(v time.Time) *Time { return &Time{v.UTC()} }
