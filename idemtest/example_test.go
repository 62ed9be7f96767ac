package idemtest_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/idemtest"
)

// A handler test: the same POST twice with one Idempotency-Key runs the
// handler once, and the second answer is the first one replayed. In a test
// function, pass its t to idemtest.New; an Example has none, so a stand-in
// takes its place.
func Example() {
	idem := idemtest.New(exampleT(), idempotency.WithCallerCredentials())
	orders := 0
	srv := httptest.NewServer(idem.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", orders)
	})))
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"item":"tea"}`))
		req.Header.Set("Idempotency-Key", "order-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get(idempotency.ReplayedHeader) == "true")
	}
	fmt.Println("orders placed:", orders)
	// Output:
	// 201 order 1 replayed: false
	// 201 order 1 replayed: true
	// orders placed: 1
}

// exampleT stands in for a test's *testing.T in an Example. Its cleanups
// never run: the in-process Redis ends with the process.
func exampleT() testing.TB { return &testing.T{} }
