package idempotency

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func keepAll(string) bool { return true }

// The recorder stores what went out with the status, and nothing else.
func TestRecorderStoresWhatWasSent(t *testing.T) {
	t.Run("headers set after the status", func(t *testing.T) {
		w := httptest.NewRecorder()
		rw := newRecorder(w, 1<<20, keepAll)
		rw.Header().Set("X-Before", "sent")
		rw.WriteHeader(http.StatusCreated)
		rw.Header().Set("X-After", "never sent")
		rec := rw.finish()
		require.Equal(t, []string{"X-Before", "sent"}, rec.header)
		require.Empty(t, w.Header().Get("X-After"))
	})
	t.Run("trailers reach the client", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rw := newRecorder(w, 1<<20, keepAll)
			rw.Header().Set("Trailer", "X-Sum")
			rw.WriteHeader(http.StatusOK)
			rw.Write([]byte("body"))
			rw.Header().Set("X-Sum", "42")
			rw.Header().Set(http.TrailerPrefix+"X-Late", "yes")
			rw.finish()
		}))
		defer srv.Close()
		resp, err := srv.Client().Get(srv.URL)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, "42", resp.Trailer.Get("X-Sum"))
		require.Equal(t, "yes", resp.Trailer.Get("X-Late"))
	})
	t.Run("a failed hijack changes nothing", func(t *testing.T) {
		w := httptest.NewRecorder() // cannot hijack
		rw := newRecorder(w, 1<<20, keepAll)
		_, _, err := rw.Hijack()
		require.Error(t, err)
		rw.Header().Set("Content-Type", "text/plain")
		rw.WriteHeader(http.StatusInternalServerError)
		rw.Write([]byte("no hijack here"))
		rec := rw.finish()
		require.NotNil(t, rec, "an ordinary answer stays replayable")
		require.Equal(t, "text/plain", w.Header().Get("Content-Type"))
	})
	t.Run("a header withdrawn after early hints", func(t *testing.T) {
		w := httptest.NewRecorder()
		rw := newRecorder(w, 1<<20, keepAll)
		rw.Header().Set("Link", "</style.css>; rel=preload")
		rw.WriteHeader(http.StatusEarlyHints)
		rw.Header().Del("Link")
		rw.WriteHeader(http.StatusOK)
		require.Empty(t, w.Header().Get("Link"))
		require.Empty(t, rw.finish().header)
	})
	t.Run("no body where none is allowed", func(t *testing.T) {
		w := httptest.NewRecorder()
		rw := newRecorder(w, 1<<20, keepAll)
		rw.WriteHeader(http.StatusNoContent)
		rw.Write([]byte("ignored"))
		require.Empty(t, rw.finish().body)
	})
	t.Run("switching protocols is not replayable", func(t *testing.T) {
		rw := newRecorder(httptest.NewRecorder(), 1<<20, keepAll)
		rw.WriteHeader(http.StatusSwitchingProtocols)
		require.Nil(t, rw.finish())
	})
}
