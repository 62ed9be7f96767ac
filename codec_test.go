package idempotency

import (
	"bytes"
	"context"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

type withWarning struct {
	Amount  int64
	Warning error // an interface JSON cannot decode into
}

// money encodes itself with methods of its pointer, from an unexported
// field, as types with an invariant to keep often do. encoding/json
// writes it {} where it cannot call them, which decodes to no money.
type money struct{ cents int64 }

type moneyJSON struct {
	Cents int64 `json:"cents"`
}

func (m *money) MarshalJSON() ([]byte, error) { return json.Marshal(moneyJSON{m.cents}) }

func (m *money) UnmarshalJSON(b []byte) error {
	var j moneyJSON
	err := json.Unmarshal(b, &j)
	m.cents = j.Cents
	return err
}

type order struct {
	ID    string
	Total money
}

// receipt is given money's methods by promotion: encoding/json writes a
// receipt as its money alone, and its Ref never travels.
type receipt struct {
	money
	Ref string
}

type withBytes struct {
	Raw  []byte
	Name string
	At   time.Time
}

// requireRoundTrip runs Do for v twice under one key: the function runs
// once, and the duplicate gets v exactly, or, when v cannot come back as it
// was, both calls say ErrNotReplayable (the first one with v).
func requireRoundTrip[T any](t *testing.T, m *Middleware, id string, v T, replayable bool) {
	t.Helper()
	var runs atomic.Int64
	fn := func(context.Context) (T, error) { runs.Add(1); return v, nil }
	key := Key{Scope: "codec", ID: id, Input: []byte(id)}
	first, err := Do(t.Context(), m, key, fn)
	require.Equal(t, v, first, "the first call returns what the function returned")
	if replayable {
		require.NoError(t, err)
	} else {
		require.ErrorIs(t, err, ErrNotReplayable, "refused at the first execution")
	}
	for range 2 {
		again, err := Do(t.Context(), m, key, fn)
		if replayable {
			require.NoError(t, err)
			require.Equal(t, v, again, "a duplicate gets the first result exactly")
		} else {
			require.ErrorIs(t, err, ErrNotReplayable)
			require.NotErrorIs(t, err, ErrUnreadableRecord)
		}
	}
	require.EqualValues(t, 1, runs.Load())
}

// Results either come back to duplicates exactly as the first call got
// them, or are refused at the first execution: never altered, never
// unreadable later.
func TestDoResultsRoundTripOrAreRefused(t *testing.T) {
	m := New(redistest.Client(t, "codec"), WithKeyPrefix("codec"), WithResponseCache(0, 0))
	at := time.Date(2026, 11, 27, 14, 0, 0, 123456789, time.UTC)
	t.Run("struct", func(t *testing.T) {
		requireRoundTrip(t, m, "struct", withBytes{Raw: []byte{0, 0xff, 'a'}, Name: "café", At: at}, true)
	})
	t.Run("map", func(t *testing.T) {
		requireRoundTrip(t, m, "map", map[string]any{"a": "b", "n": float64(3), "list": []any{true, nil}}, true)
	})
	t.Run("int64 past 2^53", func(t *testing.T) { requireRoundTrip(t, m, "int64", int64(1<<53+1), true) })
	t.Run("max uint64", func(t *testing.T) { requireRoundTrip(t, m, "uint64", uint64(math.MaxUint64), true) })
	t.Run("bytes not UTF-8", func(t *testing.T) { requireRoundTrip(t, m, "bytes", []byte("\xff\xfe"), true) })
	t.Run("int64 past 2^53 in an interface", func(t *testing.T) {
		requireRoundTrip(t, m, "any-int64", map[string]any{"id": int64(1<<53 + 1)}, false)
	})
	t.Run("string not UTF-8", func(t *testing.T) { requireRoundTrip(t, m, "string", "caf\xe9", false) })
	t.Run("string not UTF-8 in a struct", func(t *testing.T) {
		requireRoundTrip(t, m, "nested", withBytes{Name: "\xff"}, false)
	})
	t.Run("map key not UTF-8", func(t *testing.T) {
		requireRoundTrip(t, m, "mapkey", map[string]int{"\xff": 1}, false)
	})
	t.Run("interface field", func(t *testing.T) {
		requireRoundTrip(t, m, "warning", withWarning{Amount: 5, Warning: errors.New("low balance")}, false)
	})
	t.Run("interface field left nil", func(t *testing.T) {
		requireRoundTrip(t, m, "nowarning", withWarning{Amount: 5}, true)
	})
	t.Run("bytes in an interface", func(t *testing.T) {
		requireRoundTrip(t, m, "any-bytes", map[string]any{"raw": []byte{1, 2}}, false)
	})
	t.Run("time with a monotonic reading", func(t *testing.T) {
		v, err := Do(t.Context(), m, Key{ID: "now"}, func(context.Context) (time.Time, error) { return time.Now(), nil })
		require.NoError(t, err, "the monotonic reading never travels, by time.Time's own encoding")
		again, err := Do(t.Context(), m, Key{ID: "now"}, func(context.Context) (time.Time, error) { return time.Time{}, nil })
		require.NoError(t, err)
		require.True(t, v.Equal(again))
	})
	t.Run("channel", func(t *testing.T) { requireRoundTrip(t, m, "chan", make(chan int), false) })
	// encoding/json calls a method of the pointer only where it can
	// address the value; decoding always can.
	t.Run("encoded by its pointer's methods", func(t *testing.T) {
		requireRoundTrip(t, m, "ptr-marshaler", money{cents: 4200}, true)
	})
	t.Run("a field encoded by its pointer's methods", func(t *testing.T) {
		requireRoundTrip(t, m, "ptr-marshaler-field", order{ID: "o1", Total: money{cents: 4200}}, true)
	})
	t.Run("encoded by its pointer's methods in a map", func(t *testing.T) {
		requireRoundTrip(t, m, "ptr-marshaler-map", map[string]money{"total": {cents: 4200}}, false)
	})
	t.Run("given an embedded field's methods", func(t *testing.T) {
		requireRoundTrip(t, m, "promoted-marshaler", receipt{money: money{cents: 500}, Ref: "ref-1"}, false)
	})
	t.Run("given an embedded field's methods, nested", func(t *testing.T) {
		requireRoundTrip(t, m, "promoted-marshaler-nested", []receipt{{money: money{cents: 500}, Ref: "ref-1"}}, false)
	})
	t.Run("given an embedded field's methods, its fields empty", func(t *testing.T) {
		requireRoundTrip(t, m, "promoted-marshaler-empty", receipt{money: money{cents: 500}}, true)
	})
	t.Run("encoded by its pointer's methods in an interface", func(t *testing.T) {
		requireRoundTrip(t, m, "ptr-marshaler-any", []any{money{cents: 4200}}, false)
	})
}

// The check goes as deep as the result does: an int64 in an interface is
// refused 40 links deep as it is 3 links deep, and a result that refers to
// itself is compared once, not forever.
func TestCheckResultAtEveryDepth(t *testing.T) {
	nested := func(links int) any {
		var v any = map[string]any{"id": int64(1<<53 + 1)}
		for range links {
			v = map[string]any{"next": v}
		}
		return v
	}
	for _, links := range []int{3, 40, 400} {
		t.Run(fmt.Sprint(links, " links"), func(t *testing.T) {
			v := nested(links)
			body, err := JSON.Marshal(v)
			require.NoError(t, err)
			require.ErrorIs(t, CheckResult(JSON, v, body), ErrNotReplayable)
		})
	}
	t.Run("a result that refers to itself", func(t *testing.T) {
		type node struct {
			Name string
			Next *node
		}
		a, b := &node{Name: "a"}, &node{Name: "a"}
		a.Next, b.Next = a, b
		require.Empty(t, differs(reflect.ValueOf(a), reflect.ValueOf(b), nil, map[visit]bool{}))
		b.Name = "b"
		require.NotEmpty(t, differs(reflect.ValueOf(a), reflect.ValueOf(b), nil, map[visit]bool{}))
	})
}

// The check costs what the result's size does, not its depth squared: a
// result nested 9,000 deep (encoding/json reads 10,000 at most) is compared
// in a few megabytes; with a path spelled out at every level it took 420.
func TestCheckResultCostsNoMoreThanTheResult(t *testing.T) {
	type link struct{ Next *link }
	var v *link
	for range 9000 {
		v = &link{Next: v}
	}
	body, err := JSON.Marshal(v)
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	require.NoError(t, CheckResult(JSON, v, body))
	runtime.ReadMemStats(&after)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "bytes allocated to check a %d-byte result", len(body))
}

// A codec that carries NaN gives back a NaN, which equals nothing, and the
// result came back as it was: it is replayed, not refused.
func TestNaNComesBackThroughACodecThatCarriesIt(t *testing.T) {
	type reading struct{ V float64 }
	v := reading{V: math.NaN()}
	body, err := gobCodec{}.Marshal(v)
	require.NoError(t, err)
	require.NoError(t, CheckResult(gobCodec{}, v, body))
	v2 := reading{V: 1}
	require.ErrorIs(t, CheckResult(gobCodec{}, v2, body), ErrNotReplayable, "a NaN that comes back for 1 is a change")
}

// gobCodec carries what encoding/gob does, NaN included.
type gobCodec struct{}

func (gobCodec) Marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	err := gob.NewEncoder(&b).Encode(v)
	return b.Bytes(), err
}

func (gobCodec) Unmarshal(data []byte, v any) error {
	return gob.NewDecoder(bytes.NewReader(data)).Decode(v)
}
