package client

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// createdAnswer is answerCreated's answer as bytes on the wire.
const createdAnswer = "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"id\":1}"

// writeThenHangUp answers with the first bytes of answer, then closes the
// connection (a FIN, as a proxy or a server that dies mid-write does).
func writeThenHangUp(answer string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Write([]byte(answer))
			conn.Close()
		}
	}
}

// An HTTP/1 answer cut inside its status line or a header line is an
// answer lost after the request may have run, as one cut at a line's end
// or under its body is: it is resent under the same key, and the replay
// comes back. net/http reports the cut piece as a malformed line, not as
// an end of the connection.
func TestTransportRetriesAnAnswerCutUnderItsHeaders(t *testing.T) {
	for _, n := range []int{1, 5, 7, 8, 9, 10, 11, 14, 30, 36, 40, 60, 72} {
		t.Run(fmt.Sprintf("%q", createdAnswer[:n]), func(t *testing.T) {
			srv := newScriptedServer(t, writeThenHangUp(createdAnswer[:n]), answerCreated)
			code, _, body := postTo(t, fastTransport(t), newPost(t, srv.URL, `{"amount":500}`))
			require.Equal(t, http.StatusCreated, code)
			require.Equal(t, `{"id":1}`, body)
			keys := keysOf(t, srv.seen())
			require.Len(t, keys, 2)
			require.Equal(t, keys[0], keys[1], "the resend carries the first attempt's key")
		})
	}
}

// A server whose first line is not an HTTP/1 status line's beginning does
// not speak HTTP: every attempt would meet it again, and there is one.
func TestTransportReturnsAnAnswerThatIsNotHTTP(t *testing.T) {
	for _, greeting := range []string{"SSH-2.0-OpenSSH_9.2\r\n", "220 mail.example ESMTP\r\n", "HTTP/1.1 2xx OK\r\n\r\n"} {
		t.Run(fmt.Sprintf("%q", greeting), func(t *testing.T) {
			srv := newScriptedServer(t, writeThenHangUp(greeting))
			counting, calls := countAttempts(t, nil)
			resp, err := (&Transport{Base: counting, BaseDelay: 1e6}).RoundTrip(newPost(t, srv.URL, `{}`))
			if resp != nil {
				resp.Body.Close()
			}
			require.Error(t, err)
			require.EqualValues(t, 1, calls.Load(), "attempts; the error: %v", err)
		})
	}
}
