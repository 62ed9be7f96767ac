// Package require is the root module's own small assertion set: the subset
// of testify's require that the library's tests use, with the same names and
// meanings, so they read like every other Go test suite. It exists because
// the root module's go.mod is also its users' dependency graph: requiring
// testify there would put it and its four dependencies into every program
// that imports the library. The other modules of the repository use testify.
//
// Every function stops the test (t.FailNow) on failure, so, like testify's
// require, it must be called from the test's own goroutine.
package require

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"time"
)

// TestingT is the part of *testing.T these functions use.
type TestingT interface {
	Helper()
	Errorf(format string, args ...any)
	FailNow()
}

func fail(t TestingT, msgAndArgs []any, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if extra := message(msgAndArgs); extra != "" {
		msg += "\n\tmessage: " + extra
	}
	t.Errorf("%s", msg)
	t.FailNow()
}

func message(msgAndArgs []any) string {
	switch len(msgAndArgs) {
	case 0:
		return ""
	case 1:
		return fmt.Sprint(msgAndArgs[0])
	}
	if format, ok := msgAndArgs[0].(string); ok {
		return fmt.Sprintf(format, msgAndArgs[1:]...)
	}
	return fmt.Sprint(msgAndArgs...)
}

// equal is testify's ObjectsAreEqual: byte slices by content, the rest by
// reflect.DeepEqual, so values of different types are never equal.
func equal(expected, actual any) bool {
	if expected == nil || actual == nil {
		return expected == actual
	}
	if exp, ok := expected.([]byte); ok {
		act, ok := actual.([]byte)
		if !ok {
			return false
		}
		if exp == nil || act == nil {
			return exp == nil && act == nil // testify tells nil from empty
		}
		return bytes.Equal(exp, act)
	}
	return reflect.DeepEqual(expected, actual)
}

// equalValues also accepts values equal after converting one to the
// other's type (an int and an int64 of the same value).
func equalValues(expected, actual any) bool {
	if equal(expected, actual) {
		return true
	}
	if expected == nil || actual == nil {
		return false
	}
	e, a := reflect.ValueOf(expected), reflect.ValueOf(actual)
	if isNumber(e.Kind()) != isNumber(a.Kind()) {
		return false // no 65 == "A"
	}
	// Both ways, so that a conversion that loses bits (257 to int8) cannot
	// make two different values equal.
	return a.Type().ConvertibleTo(e.Type()) && e.Type().ConvertibleTo(a.Type()) &&
		reflect.DeepEqual(expected, a.Convert(e.Type()).Interface()) &&
		reflect.DeepEqual(e.Convert(a.Type()).Interface(), actual)
}

func isNumber(k reflect.Kind) bool {
	return k >= reflect.Int && k <= reflect.Complex128
}

// Equal fails unless expected and actual are equal.
func Equal(t TestingT, expected, actual any, msgAndArgs ...any) {
	t.Helper()
	if !equal(expected, actual) {
		fail(t, msgAndArgs, "not equal:\n\texpected: %#v\n\tactual:   %#v", expected, actual)
	}
}

// EqualValues fails unless expected and actual are equal, after converting
// one to the other's type.
func EqualValues(t TestingT, expected, actual any, msgAndArgs ...any) {
	t.Helper()
	if !equalValues(expected, actual) {
		fail(t, msgAndArgs, "not equal values:\n\texpected: %#v (%T)\n\tactual:   %#v (%T)", expected, expected, actual, actual)
	}
}

// NotEqual fails when expected and actual are equal.
func NotEqual(t TestingT, expected, actual any, msgAndArgs ...any) {
	t.Helper()
	if equal(expected, actual) {
		fail(t, msgAndArgs, "should not be equal: %#v", actual)
	}
}

// True fails unless value is true.
func True(t TestingT, value bool, msgAndArgs ...any) {
	t.Helper()
	if !value {
		fail(t, msgAndArgs, "should be true")
	}
}

// False fails unless value is false.
func False(t TestingT, value bool, msgAndArgs ...any) {
	t.Helper()
	if value {
		fail(t, msgAndArgs, "should be false")
	}
}

func isNil(object any) bool {
	if object == nil {
		return true
	}
	v := reflect.ValueOf(object)
	switch v.Kind() {
	case reflect.Chan, reflect.Func, reflect.Interface, reflect.Map, reflect.Pointer, reflect.Slice, reflect.UnsafePointer:
		return v.IsNil()
	}
	return false
}

// Nil fails unless object is nil (a nil pointer, map, slice… included).
func Nil(t TestingT, object any, msgAndArgs ...any) {
	t.Helper()
	if !isNil(object) {
		fail(t, msgAndArgs, "expected nil, got %#v", object)
	}
}

// NotNil fails when object is nil.
func NotNil(t TestingT, object any, msgAndArgs ...any) {
	t.Helper()
	if isNil(object) {
		fail(t, msgAndArgs, "expected a value, got nil")
	}
}

// isEmpty is testify's: nil, a zero value, an empty chan, map or slice, or
// a pointer to something empty.
func isEmpty(object any) bool {
	if object == nil {
		return true
	}
	v := reflect.ValueOf(object)
	switch v.Kind() {
	case reflect.Chan, reflect.Map, reflect.Slice:
		return v.Len() == 0
	case reflect.Pointer:
		if v.IsNil() {
			return true
		}
		return isEmpty(v.Elem().Interface())
	}
	return v.IsZero()
}

// Empty fails unless object is empty (see isEmpty).
func Empty(t TestingT, object any, msgAndArgs ...any) {
	t.Helper()
	if !isEmpty(object) {
		fail(t, msgAndArgs, "should be empty, but was %#v", object)
	}
}

// NotEmpty fails when object is empty.
func NotEmpty(t TestingT, object any, msgAndArgs ...any) {
	t.Helper()
	if isEmpty(object) {
		fail(t, msgAndArgs, "should not be empty, but was %#v", object)
	}
}

// Zero fails unless i is its type's zero value.
func Zero(t TestingT, i any, msgAndArgs ...any) {
	t.Helper()
	if i != nil && !reflect.ValueOf(i).IsZero() {
		fail(t, msgAndArgs, "should be zero, but was %#v", i)
	}
}

// NotZero fails when i is its type's zero value.
func NotZero(t TestingT, i any, msgAndArgs ...any) {
	t.Helper()
	if i == nil || reflect.ValueOf(i).IsZero() {
		fail(t, msgAndArgs, "should not be zero, but was %#v", i)
	}
}

// Len fails unless object (a string, slice, array, map or chan) has length n.
func Len(t TestingT, object any, n int, msgAndArgs ...any) {
	t.Helper()
	v := reflect.ValueOf(object)
	switch v.Kind() {
	case reflect.String, reflect.Slice, reflect.Array, reflect.Map, reflect.Chan:
		if v.Len() != n {
			fail(t, msgAndArgs, "should have %d item(s), but has %d: %#v", n, v.Len(), object)
		}
	default:
		fail(t, msgAndArgs, "%#v has no length", object)
	}
}

// contains reports whether s (a string, slice, array or map) holds element
// (a substring, an element, a key); ok is false when s holds nothing.
func contains(s, element any) (found, ok bool) {
	v := reflect.ValueOf(s)
	switch v.Kind() {
	case reflect.String:
		sub, isString := element.(string)
		if !isString {
			return false, false
		}
		return strings.Contains(v.String(), sub), true
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if equal(v.Index(i).Interface(), element) {
				return true, true
			}
		}
		return false, true
	case reflect.Map:
		for _, k := range v.MapKeys() {
			if equal(k.Interface(), element) {
				return true, true
			}
		}
		return false, true
	}
	return false, false
}

// Contains fails unless s holds contains (a substring, an element, a key).
func Contains(t TestingT, s, element any, msgAndArgs ...any) {
	t.Helper()
	found, ok := contains(s, element)
	if !ok {
		fail(t, msgAndArgs, "%#v cannot hold %#v", s, element)
		return
	}
	if !found {
		fail(t, msgAndArgs, "%#v does not contain %#v", s, element)
	}
}

// NotContains fails when s holds contains.
func NotContains(t TestingT, s, element any, msgAndArgs ...any) {
	t.Helper()
	found, ok := contains(s, element)
	if !ok {
		fail(t, msgAndArgs, "%#v cannot hold %#v", s, element)
		return
	}
	if found {
		fail(t, msgAndArgs, "%#v should not contain %#v", s, element)
	}
}

// compare orders two values of one ordered kind (integers, floats,
// strings, durations, times); ok is false for anything else.
func compare(a, b any) (order int, ok bool) {
	if ta, isTime := a.(time.Time); isTime {
		tb, isTime := b.(time.Time)
		if !isTime {
			return 0, false
		}
		return ta.Compare(tb), true
	}
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	if !va.IsValid() || !vb.IsValid() || va.Type() != vb.Type() {
		return 0, false
	}
	switch va.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return cmp3(va.Int() < vb.Int(), va.Int() > vb.Int()), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return cmp3(va.Uint() < vb.Uint(), va.Uint() > vb.Uint()), true
	case reflect.Float32, reflect.Float64:
		return cmp3(va.Float() < vb.Float(), va.Float() > vb.Float()), true
	case reflect.String:
		return strings.Compare(va.String(), vb.String()), true
	}
	return 0, false
}

func cmp3(less, greater bool) int {
	switch {
	case less:
		return -1
	case greater:
		return 1
	}
	return 0
}

func ordered(t TestingT, e1, e2 any, holds func(int) bool, relation string, msgAndArgs []any) {
	t.Helper()
	order, ok := compare(e1, e2)
	if !ok {
		fail(t, msgAndArgs, "cannot compare %#v (%T) and %#v (%T)", e1, e1, e2, e2)
		return
	}
	if !holds(order) {
		fail(t, msgAndArgs, "%v is not %s %v", e1, relation, e2)
	}
}

// Less fails unless e1 < e2.
func Less(t TestingT, e1, e2 any, msgAndArgs ...any) {
	t.Helper()
	ordered(t, e1, e2, func(o int) bool { return o < 0 }, "less than", msgAndArgs)
}

// LessOrEqual fails unless e1 <= e2.
func LessOrEqual(t TestingT, e1, e2 any, msgAndArgs ...any) {
	t.Helper()
	ordered(t, e1, e2, func(o int) bool { return o <= 0 }, "less than or equal to", msgAndArgs)
}

// Greater fails unless e1 > e2.
func Greater(t TestingT, e1, e2 any, msgAndArgs ...any) {
	t.Helper()
	ordered(t, e1, e2, func(o int) bool { return o > 0 }, "greater than", msgAndArgs)
}

// GreaterOrEqual fails unless e1 >= e2.
func GreaterOrEqual(t TestingT, e1, e2 any, msgAndArgs ...any) {
	t.Helper()
	ordered(t, e1, e2, func(o int) bool { return o >= 0 }, "greater than or equal to", msgAndArgs)
}

// Positive fails unless e is above its type's zero.
func Positive(t TestingT, e any, msgAndArgs ...any) {
	t.Helper()
	zero := reflect.Zero(reflect.TypeOf(e)).Interface()
	ordered(t, e, zero, func(o int) bool { return o > 0 }, "greater than", msgAndArgs)
}

// InDelta fails unless expected and actual (any numbers) differ by at most
// delta.
func InDelta(t TestingT, expected, actual any, delta float64, msgAndArgs ...any) {
	t.Helper()
	e, eok := toFloat(expected)
	a, aok := toFloat(actual)
	if !eok || !aok {
		fail(t, msgAndArgs, "InDelta needs numbers, got %#v and %#v", expected, actual)
		return
	}
	if d := e - a; d > delta || d < -delta {
		fail(t, msgAndArgs, "%v and %v differ by %v, more than %v", expected, actual, d, delta)
	}
}

func toFloat(x any) (float64, bool) {
	v := reflect.ValueOf(x)
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return float64(v.Int()), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return float64(v.Uint()), true
	case reflect.Float32, reflect.Float64:
		return v.Float(), true
	}
	return 0, false
}

// Regexp fails unless str (printed with fmt.Sprint) matches rx (a string
// or a *regexp.Regexp).
func Regexp(t TestingT, rx, str any, msgAndArgs ...any) {
	t.Helper()
	re, ok := rx.(*regexp.Regexp)
	if !ok {
		re = regexp.MustCompile(fmt.Sprint(rx))
	}
	if s := fmt.Sprint(str); !re.MatchString(s) {
		fail(t, msgAndArgs, "%q does not match %q", s, re)
	}
}

// NoError fails when err is not nil.
func NoError(t TestingT, err error, msgAndArgs ...any) {
	t.Helper()
	if err != nil {
		fail(t, msgAndArgs, "unexpected error: %v", err)
	}
}

// Error fails when err is nil.
func Error(t TestingT, err error, msgAndArgs ...any) {
	t.Helper()
	if err == nil {
		fail(t, msgAndArgs, "an error is expected, got nil")
	}
}

// ErrorIs fails unless errors.Is(err, target).
func ErrorIs(t TestingT, err, target error, msgAndArgs ...any) {
	t.Helper()
	if !errors.Is(err, target) {
		fail(t, msgAndArgs, "error %v is not %v", err, target)
	}
}

// ErrorContains fails unless err is not nil and its message holds substr.
func ErrorContains(t TestingT, err error, substr string, msgAndArgs ...any) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), substr) {
		fail(t, msgAndArgs, "error %v does not contain %q", err, substr)
	}
}

// recovered runs f and returns what it panicked with.
func recovered(f func()) (value any, panicked bool) {
	panicked = true
	defer func() { value = recover() }()
	f()
	panicked = false
	return nil, false
}

// Panics fails unless f panics.
func Panics(t TestingT, f func(), msgAndArgs ...any) {
	t.Helper()
	if _, panicked := recovered(f); !panicked {
		fail(t, msgAndArgs, "should panic")
	}
}

// PanicsWithValue fails unless f panics with value expected.
func PanicsWithValue(t TestingT, expected any, f func(), msgAndArgs ...any) {
	t.Helper()
	value, panicked := recovered(f)
	if !panicked {
		fail(t, msgAndArgs, "should panic with %#v", expected)
		return
	}
	if !equal(expected, value) {
		fail(t, msgAndArgs, "panicked with %#v, expected %#v", value, expected)
	}
}

// NotPanics fails when f panics.
func NotPanics(t TestingT, f func(), msgAndArgs ...any) {
	t.Helper()
	if value, panicked := recovered(f); panicked {
		fail(t, msgAndArgs, "should not panic, panicked with %#v", value)
	}
}

// Eventually fails unless condition returns true within waitFor, checked
// every tick.
func Eventually(t TestingT, condition func() bool, waitFor, tick time.Duration, msgAndArgs ...any) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		if condition() {
			return
		}
		if time.Now().After(deadline) {
			fail(t, msgAndArgs, "condition not met within %v", waitFor)
			return // FailNow of a fake TestingT may return
		}
		time.Sleep(tick)
	}
}
