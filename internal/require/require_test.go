package require

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// recorder is a TestingT that remembers whether a check failed.
type recorder struct{ failed bool }

func (*recorder) Helper()                 {}
func (r *recorder) Errorf(string, ...any) { r.failed = true }
func (r *recorder) FailNow()              { r.failed = true }

// The checks mean what testify's do: the root module's tests rely on it.
func TestChecksAgreeWithTestify(t *testing.T) {
	errBase := errors.New("base")
	cases := []struct {
		name string
		pass bool
		run  func(TestingT)
	}{
		{"Equal bytes by content", true, func(t TestingT) { Equal(t, []byte("a"), []byte("a")) }},
		{"Equal types differ", false, func(t TestingT) { Equal(t, 1, int64(1)) }},
		{"Equal nil and empty bytes", false, func(t TestingT) { Equal(t, []byte(nil), []byte{}) }},
		{"EqualValues lossy conversion", false, func(t TestingT) { EqualValues(t, int8(1), 257) }},
		{"EqualValues number and string", false, func(t TestingT) { EqualValues(t, "A", 65) }},
		{"EqualValues converts", true, func(t TestingT) { EqualValues(t, 1, int64(1)) }},
		{"EqualValues other value", false, func(t TestingT) { EqualValues(t, 2, int64(1)) }},
		{"Empty nil slice", true, func(t TestingT) { Empty(t, []int(nil)) }},
		{"Empty zero struct", true, func(t TestingT) { Empty(t, struct{ A int }{}) }},
		{"Empty non-empty map", false, func(t TestingT) { Empty(t, map[int]int{1: 1}) }},
		{"Nil typed nil pointer", true, func(t TestingT) { Nil(t, (*int)(nil)) }},
		{"Zero", false, func(t TestingT) { Zero(t, 3) }},
		{"Len", true, func(t TestingT) { Len(t, "abc", 3) }},
		{"Contains substring", true, func(t TestingT) { Contains(t, "hello", "ell") }},
		{"Contains element", true, func(t TestingT) { Contains(t, []int{201, 409}, 409) }},
		{"Contains map key", false, func(t TestingT) { Contains(t, map[string]int{"a": 1}, "b") }},
		{"NotContains", true, func(t TestingT) { NotContains(t, []string{"a"}, "b") }},
		{"Less durations", true, func(t TestingT) { Less(t, time.Second, 2*time.Second) }},
		{"Less mixed types", false, func(t TestingT) { Less(t, 1, int64(2)) }},
		{"GreaterOrEqual", true, func(t TestingT) { GreaterOrEqual(t, 2, 2) }},
		{"Positive", false, func(t TestingT) { Positive(t, 0) }},
		{"InDelta", true, func(t TestingT) { InDelta(t, 10, 10.4, 0.5) }},
		{"ErrorIs wrapped", true, func(t TestingT) { ErrorIs(t, fmt.Errorf("x: %w", errBase), errBase) }},
		{"ErrorContains", false, func(t TestingT) { ErrorContains(t, errBase, "other") }},
		{"Panics", true, func(t TestingT) { Panics(t, func() { panic("x") }) }},
		{"PanicsWithValue other value", false, func(t TestingT) { PanicsWithValue(t, "y", func() { panic("x") }) }},
		{"NotPanics", false, func(t TestingT) { NotPanics(t, func() { panic("x") }) }},
		{"Regexp", true, func(t TestingT) { Regexp(t, `^\d+$`, 123) }},
		{"Eventually", true, func(t TestingT) {
			n := 0
			Eventually(t, func() bool { n++; return n > 3 }, time.Second, time.Millisecond)
		}},
		{"Eventually times out", false, func(t TestingT) {
			Eventually(t, func() bool { return false }, 10*time.Millisecond, time.Millisecond)
		}},
	}
	for _, c := range cases {
		r := &recorder{}
		c.run(r)
		if r.failed == c.pass {
			t.Errorf("%s: failed=%v, want pass=%v", c.name, r.failed, c.pass)
		}
	}
}
