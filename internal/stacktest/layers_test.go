package stacktest

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/felixge/httpsnoop"
	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/klauspost/compress/gzhttp"
	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"
	"github.com/onceonly/idempotency"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
)

// A layer is middleware the way users compose it around a protected
// handler: outside the protection (outer) or between it and the handler
// (inner). Each stack builds its own, so per-request state (a session
// counter) runs alike in the stack with the middleware and the one
// without.
type layer struct {
	name  string
	outer func(t *testing.T, next http.Handler) http.Handler
	// inner gets the stack's Middleware, nil in the stack without it.
	inner func(t *testing.T, m *idempotency.Middleware, next http.Handler) http.Handler
	// cannotFlush: the writer the layer gives inward cannot flush, so a
	// handler's flush streams nothing.
	cannotFlush bool
	// compresses: an inner layer that compresses by the request's
	// Accept-Encoding, so the stored answer is compressed (and small) for
	// a first request that accepted gzip, and a duplicate that does not
	// accept it gets it decoded.
	compresses bool
	// takes1xx: the layer takes an informational status for the final one
	// (its own bug): its first answer to a handler that sends 103 differs
	// from a replay, which has no 103 to send.
	takes1xx bool
}

var layers = []layer{
	{name: "bare"},
	{name: "gzhttp outside", outer: func(_ *testing.T, next http.Handler) http.Handler { return gzhttp.GzipHandler(next) }},
	{name: "gzhttp inside", compresses: true, inner: func(_ *testing.T, _ *idempotency.Middleware, next http.Handler) http.Handler {
		return gzhttp.GzipHandler(next)
	}},
	{name: "chi Compress outside", takes1xx: true, outer: func(_ *testing.T, next http.Handler) http.Handler { return middleware.Compress(5)(next) }},
	{name: "chi Compress inside", compresses: true, inner: func(_ *testing.T, _ *idempotency.Middleware, next http.Handler) http.Handler {
		return middleware.Compress(5)(next)
	}},
	{name: "http.TimeoutHandler", cannotFlush: true, takes1xx: true, outer: func(_ *testing.T, next http.Handler) http.Handler {
		return http.TimeoutHandler(next, 10*time.Second, "timed out")
	}},
	{name: "http.MaxBytesHandler", outer: func(_ *testing.T, next http.Handler) http.Handler {
		return http.MaxBytesHandler(next, 1<<10)
	}},
	// The upstream answers whole, so the proxy has nothing to flush.
	{name: "ReverseProxy to a compressing upstream", cannotFlush: true, compresses: true, inner: reverseProxy},
	{name: "CORS", outer: cors},
	{name: "httpsnoop logger", outer: func(_ *testing.T, next http.Handler) http.Handler {
		var last atomic.Int64
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m := httpsnoop.CaptureMetrics(next, w, r)
			last.Store(int64(m.Code))
		})
	}},
	{name: "otelhttp", outer: func(_ *testing.T, next http.Handler) http.Handler { return otelhttp.NewHandler(next, "pay") }},
	{name: "session refresh", outer: session},
	{name: "gin Recovery", outer: func(_ *testing.T, next http.Handler) http.Handler {
		gin.SetMode(gin.ReleaseMode)
		e := gin.New()
		e.Use(gin.Recovery())
		e.Any("/*path", gin.WrapH(next))
		return e
	}},
	{name: "echo Recover", takes1xx: true, outer: func(_ *testing.T, next http.Handler) http.Handler {
		e := echo.New()
		e.Use(echomw.Recover())
		e.Any("/*", echo.WrapHandler(next))
		return e
	}},
	{name: "the middleware twice", inner: func(_ *testing.T, m *idempotency.Middleware, next http.Handler) http.Handler {
		if m == nil {
			return next
		}
		return m.ProtectKey(next)
	}},
}

// cors answers as a CORS layer does: the origin allowed, the marker
// exposed, and Vary: Origin added.
func cors(_ *testing.T, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Vary", "Origin")
		if origin := r.Header.Get("Origin"); origin != "" {
			w.Header().Set("Access-Control-Allow-Origin", origin)
			w.Header().Set("Access-Control-Expose-Headers", idempotency.ReplayedHeader)
		}
		next.ServeHTTP(w, r)
	})
}

// session refreshes its cookie on every request, as session managers do.
func session(_ *testing.T, next http.Handler) http.Handler {
	var n atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "s" + strconv.FormatInt(n.Add(1), 10), Path: "/"})
		next.ServeHTTP(w, r)
	})
}

// reverseProxy is the protected handler as a gateway: it forwards to an
// upstream that runs the handler and compresses its answer by the
// request's Accept-Encoding, with a Content-Length when the handler gave
// one.
func reverseProxy(t *testing.T, _ *idempotency.Middleware, next http.Handler) http.Handler {
	upstream := httptest.NewServer(compressing(next))
	t.Cleanup(upstream.Close)
	u, err := url.Parse(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.Transport = &http.Transport{DisableCompression: true}
	proxy.ErrorLog = discardLog
	return proxy
}

// compressing gzips a whole answer for a request that accepts gzip, after
// the handler returned, and says Vary: Accept-Encoding.
func compressing(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		res := rec.Result()
		body, _ := io.ReadAll(res.Body)
		for name, values := range res.Header {
			w.Header()[name] = values
		}
		w.Header().Add("Vary", "Accept-Encoding")
		if len(body) > 0 && r.Header.Get("Accept-Encoding") == "gzip" {
			var zipped bytes.Buffer
			zw := gzip.NewWriter(&zipped)
			zw.Write(body)
			zw.Close()
			body = zipped.Bytes()
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		}
		w.WriteHeader(res.StatusCode)
		w.Write(body)
	})
}
