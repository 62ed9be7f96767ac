package servertest_test

import (
	"net/http"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// A handler may set a header under a name that is not canonical
// (w.Header()["ETag"]): net/http sends it as it is written. Every replay
// keeps it, from Redis, from SQL after Redis forgot, and through recovery,
// with an allowlist of replayed headers too; and a cookie under such a
// name is still never replayed.
func TestNonCanonicalHeaderNamesAreKept(t *testing.T) {
	for _, policy := range []struct {
		name string
		opts []idempotency.Option
	}{
		{"default policy", nil},
		{"allowlist", []idempotency.Option{idempotency.WithReplayHeaders("ETag", "X-Note", "Content-Type")}},
	} {
		t.Run(policy.name, func(t *testing.T) {
			sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
				b := newBank(t, d, policy.opts...)
				b.header = http.Header{"ETag": {`"v1"`}, "x-note": {"kept"}, "set-cookie": {"session=s1"}}
				check := func(what string, r reply, first bool) {
					t.Helper()
					if r.status != 201 || r.header.Get("ETag") != `"v1"` || r.header.Get("X-Note") != "kept" {
						t.Errorf("%s: %d, header %q; want ETag and X-Note kept", what, r.status, r.header)
					}
					if cookie := r.header.Get("Set-Cookie"); first != (cookie != "") {
						t.Errorf("%s: Set-Cookie %q; want it on the first answer only", what, cookie)
					}
				}
				check("first", b.post("k1", 2), true)
				check("replayed from Redis", b.post("k1", 2), false)
				must(t, b.rdb.Del(t.Context(), b.record("k1")).Err())
				check("replayed from SQL", b.post("k1", 2), false)
				check("replayed from Redis again", b.post("k1", 2), false)
				b.abandon("k1")
				check("recovered", b.post("k1", 2), false)
				if b.runs.Load() != 1 {
					t.Errorf("transfer ran %d times", b.runs.Load())
				}
			})
		})
	}
}
