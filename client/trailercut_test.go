package client

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// A chunked answer whose connection closes after its last chunk, inside
// its trailer section, came whole but for its trailers: net/http reports
// the trailer as cut or as suspiciously long, not as the end of the
// connection. The body resumes from the replay, as one cut in its body
// does, and the caller gets the receipt and the replay's trailers, not an
// error after the payment ran.
func TestTransportResumesAnAnswerCutInItsTrailers(t *testing.T) {
	for _, cut := range []string{"0\r\n", "0\r\n\r", "0\r\nX-Receipt-Le", "0\r\nX-Receipt-Length: 95000\r\n"} {
		t.Run(strconv.Quote(cut), func(t *testing.T) {
			protected, payments := paymentRoute(t, "test-client-trailer-")
			var first atomic.Bool
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !first.CompareAndSwap(false, true) {
					protected.ServeHTTP(w, r)
					return
				}
				protected.ServeHTTP(httptest.NewRecorder(), r) // it ran and was stored
				conn, _, err := http.NewResponseController(w).Hijack()
				if err != nil {
					return
				}
				fmt.Fprintf(conn, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nTrailer: X-Receipt-Length\r\n"+
					"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n%s", len(receipt), receipt, cut)
				conn.Close() // the rest of the trailer section is lost
			}))
			t.Cleanup(srv.Close)

			resp, err := (&http.Client{Transport: fastTransport(t)}).Do(newPost(t, srv.URL, `{"amount":500}`))
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, string(receipt), string(body))
			require.Equal(t, strconv.Itoa(len(receipt)), resp.Trailer.Get("X-Receipt-Length"), "the replay's trailers")
			require.EqualValues(t, 1, payments.Load())
		})
	}
}
