package idempotency

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
)

// The codec contract: what Do stores for a result decodes, for every
// duplicate, to the result the first call returned. Do checks it when it
// stores the result, so that a result that would come back altered, or
// not at all, is refused once, at the first execution (ErrNotReplayable),
// instead of replayed changed with a nil error or found unreadable
// (ErrUnreadableRecord) by every redelivery.

// errNotRoundTrip is why a result was not stored for replay.
type errNotRoundTrip struct{ why error }

func (e errNotRoundTrip) Error() string {
	return "idempotency: the function's result would not come back as it was, so it is not stored for replay: " + e.why.Error()
}

func (e errNotRoundTrip) Unwrap() []error { return []error{ErrNotReplayable, e.why} }

// CheckResult reports why body, which codec made of v, would not give
// duplicates v back (an error that wraps ErrNotReplayable), or nil when it
// does: the check Do makes before it stores a result, for code that stores
// a result of Do's elsewhere (sqlidem.Run commits it in SQL). Every codec's
// bytes must decode into a T, and to what v is, compared as encoding/json
// sees a value (see differs): that catches what a codec changes on the way,
// such as encoding/json itself (a string that is not UTF-8 gets U+FFFD, an
// integer past 2^53 or a []byte in an interface comes back a float64 or a
// base64 string), or a codec that writes some values as JSON (grpcidem's).
// Every codec gets the check, the default one and any other alike.
func CheckResult[T any](codec Codec, v T, body []byte) error {
	var back T
	if err := codec.Unmarshal(body, &back); err != nil {
		return errNotRoundTrip{fmt.Errorf("the stored bytes do not decode: %w", err)}
	}
	if where := differs(reflect.ValueOf(v), reflect.ValueOf(back), nil, map[visit]bool{}); where != "" {
		return errNotRoundTrip{fmt.Errorf("the codec gives it back changed at %s; carry bytes that are not UTF-8 "+
			"in a []byte, give an interface a concrete type, or use a Codec that keeps it (UseCodec)", where)}
	}
	return nil
}

// encodesItself reports whether encoding/json encodes a with its own
// MarshalJSON or MarshalText, declared on its type or on its pointer: a
// value where encoding/json cannot address it (in a map, in an interface)
// skips a method of the pointer, and its decoding, which can, calls the
// other, so that a value in such a place may come back changed.
func encodesItself(a reflect.Value) bool {
	if !a.CanInterface() {
		return false // an unexported embedded field's: compared by its fields
	}
	return encoder(a.Type())
}

// encoder reports whether t or its pointer has MarshalJSON or MarshalText.
func encoder(t reflect.Type) bool {
	for _, t := range []reflect.Type{t, reflect.PointerTo(t)} {
		if t.Implements(jsonMarshaler) || t.Implements(textMarshaler) {
			return true
		}
	}
	return false
}

// embedsAnEncoder reports whether t is a struct with an embedded field
// that is an encoder, whose method the struct may have by promotion.
func embedsAnEncoder(t reflect.Type) bool {
	if t.Kind() != reflect.Struct {
		return false
	}
	for i := range t.NumField() {
		if f := t.Field(i); f.Anonymous && encoder(f.Type) {
			return true
		}
	}
	return false
}

// A visit is a pair of references differs is comparing.
type visit struct {
	a, b uintptr
	t    reflect.Type
	n    int
}

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// differs names the first place where b, the decoded copy, is not a, or
// returns "". It compares what encoding/json carries: exported and
// embedded fields not tagged "-" (the others never travel, by the type's
// own choice), map entries, elements; a type that encodes itself
// (MarshalJSON, MarshalText: time.Time, also on its pointer) is compared
// by its encoding, made where encoding/json can address it, and
// a nil slice or map equals an empty one. It goes as deep as the values
// do: a pair of pointers, maps or slices it is comparing already (a value
// that refers to itself) is not compared again, as reflect.DeepEqual does.
//
// Where it is in the value is a chain of places, spelled out only for the
// difference it finds: a path string built at every level would cost the
// square of the depth.
func differs(a, b reflect.Value, at *place, seen map[visit]bool) string {
	switch {
	case !a.IsValid() || !b.IsValid():
		if a.IsValid() != b.IsValid() {
			return at.String()
		}
		return ""
	case a.Type() != b.Type():
		return fmt.Sprintf("%s (a %s comes back a %s)", at, a.Type(), b.Type())
	}
	if encodesItself(a) {
		ja, errA := json.Marshal(addressable(a.Interface()))
		jb, errB := json.Marshal(addressable(b.Interface()))
		if errA != nil || errB != nil || !bytes.Equal(ja, jb) {
			return at.String()
		}
		if !embedsAnEncoder(a.Type()) {
			return ""
		}
		// The method may be an embedded field's, promoted: it encodes that
		// field alone, and the struct's other fields are lost on the way.
		// They are compared too.
	}
	switch a.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice:
		if !a.IsNil() && !b.IsNil() {
			v := visit{a.Pointer(), b.Pointer(), a.Type(), 0}
			if a.Kind() == reflect.Slice {
				v.n = a.Len() // slices of one array differ by their length
			}
			if seen[v] {
				return ""
			}
			seen[v] = true
		}
	}
	switch a.Kind() {
	case reflect.Pointer, reflect.Interface:
		if a.IsNil() || b.IsNil() {
			if a.IsNil() != b.IsNil() {
				return at.String()
			}
			return ""
		}
		return differs(a.Elem(), b.Elem(), at, seen)
	case reflect.Struct:
		t := a.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if (!f.IsExported() && !f.Anonymous) || f.Tag.Get("json") == "-" {
				continue
			}
			if where := differs(a.Field(i), b.Field(i), &place{up: at, field: f.Name}, seen); where != "" {
				return where
			}
		}
	case reflect.Map:
		if a.Len() != b.Len() {
			return at.String()
		}
		for it := a.MapRange(); it.Next(); {
			if where := differs(it.Value(), b.MapIndex(it.Key()), &place{up: at, key: it.Key()}, seen); where != "" {
				return where
			}
		}
	case reflect.Slice, reflect.Array:
		if a.Len() != b.Len() {
			return at.String()
		}
		for i := range a.Len() {
			if where := differs(a.Index(i), b.Index(i), &place{up: at, index: i, indexed: true}, seen); where != "" {
				return where
			}
		}
	case reflect.String:
		if a.String() != b.String() {
			return at.String()
		}
	case reflect.Float32, reflect.Float64:
		// A codec that carries NaN (gob, protobuf) gives back a NaN, which
		// equals nothing: it came back as it was all the same.
		if x, y := a.Float(), b.Float(); x != y && !(math.IsNaN(x) && math.IsNaN(y)) {
			return at.String()
		}
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		if !a.Equal(b) {
			return at.String()
		}
	}
	return ""
}

// A place is one step from the result into its value: a field, an index
// or a map key, after the place up (nil: the result itself).
type place struct {
	up      *place
	field   string
	indexed bool
	index   int
	key     reflect.Value
}

// String spells the place out from the result: result.Orders[3]["id"].
func (p *place) String() string {
	var chain []*place
	for q := p; q != nil; q = q.up {
		chain = append(chain, q)
	}
	var b strings.Builder
	b.WriteString("result")
	for i := len(chain) - 1; i >= 0; i-- {
		switch q := chain[i]; {
		case q.field != "":
			b.WriteString("." + q.field)
		case q.indexed:
			fmt.Fprintf(&b, "[%d]", q.index)
		default:
			fmt.Fprintf(&b, "[%q]", q.key)
		}
	}
	return b.String()
}
