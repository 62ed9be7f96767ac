package sqlidem

import (
	"net/http"
	"reflect"
	"testing"
)

// Header values are bytes: every one of them must come back as it went
// in, valid UTF-8 or not.
func TestHeaderRoundTripsEveryByte(t *testing.T) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	h := http.Header{
		"Content-Disposition": {`attachment; filename="caf` + "\xe9" + `.pdf"`},
		"X-All-Bytes":         {string(all)},
		"X-Utf8":              {"héllo, 世界"},
		"Location":            {"/transfers/7", "/second"},
	}
	data, err := encodeHeader(h)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeHeader(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, h) {
		t.Fatalf("round trip changed the header:\n got %q\nwant %q", got, h)
	}
	if ascii, _ := encodeHeader(http.Header{"Location": {"/a"}}); string(ascii) != `{"Location":["/a"]}` {
		t.Fatalf("ASCII stored as %s; want it readable as itself", ascii)
	}
	for i, c := range data {
		if c >= 0x80 {
			t.Fatalf("byte %d of the stored header is %#x: a latin1 column would refuse it", i, c)
		}
	}
}

func FuzzHeaderRoundTrip(f *testing.F) {
	f.Add("caf\xe9", "x")
	f.Fuzz(func(t *testing.T, a, b string) {
		h := http.Header{"A": {a, b}, b: {a}}
		data, err := encodeHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeHeader(data)
		if err != nil || !reflect.DeepEqual(got, h) {
			t.Fatalf("%q came back as %q (%v)", h, got, err)
		}
	})
}
