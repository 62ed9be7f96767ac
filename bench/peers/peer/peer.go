// Package peer is what the side-by-side servers share: their command line,
// the trivial handler's answer, and the counts the driver reads to check
// every answer of a run: how often the handler ran, and how many answers
// were 201s and 201 replays. The servers count, not the load generator:
// wrk's per-response Lua hook costs it most of its throughput.
package peer

import (
	"encoding/json"
	"flag"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// Path is the protected endpoint; StatsPath answers the counts, outside any
// middleware.
const (
	Path      = "/payments"
	StatsPath = "/stats"
)

// Flags is a server's command line.
type Flags struct {
	Addr      string        // loopback address to listen on
	Redis     string        // host:port of the Redis the middleware uses
	Lifetime  time.Duration // the server stops by itself after this long
	Instance  string        // tells the answers of two instances apart
	RedisHost string
	RedisPort int
	Postgres  string // PostgreSQL URL, for the servers on PostgreSQL
	Table     string // the table a server on PostgreSQL keeps its keys in
}

// ParseFlags reads the command line and refuses anything but loopback and
// a bounded lifetime.
func ParseFlags(needRedis bool) Flags { return parseFlags(needRedis, false) }

// ParsePostgresFlags reads the command line of a server on PostgreSQL:
// -postgres, a URL whose host is loopback, and -table are required.
func ParsePostgresFlags() Flags { return parseFlags(false, true) }

func parseFlags(needRedis, needPostgres bool) Flags {
	var f Flags
	flag.StringVar(&f.Addr, "addr", "127.0.0.1:0", "loopback address to listen on")
	flag.StringVar(&f.Redis, "redis", "", "Redis host:port")
	flag.DurationVar(&f.Lifetime, "for", 5*time.Minute, "how long to serve before stopping")
	flag.StringVar(&f.Instance, "instance", "a", "instance name, part of every answer's id")
	if needPostgres {
		flag.StringVar(&f.Postgres, "postgres", "", "PostgreSQL URL (loopback)")
		flag.StringVar(&f.Table, "table", "", "the table to keep keys in")
	}
	flag.Parse()
	if f.Lifetime <= 0 || f.Lifetime > 15*time.Minute {
		log.Fatal("-for must be in (0, 15m]")
	}
	mustLoopback(f.Addr)
	if needRedis {
		if f.Redis == "" {
			log.Fatal("-redis is required")
		}
		mustLoopback(f.Redis)
		host, port, _ := net.SplitHostPort(f.Redis)
		f.RedisHost = host
		f.RedisPort, _ = strconv.Atoi(port)
	}
	if needPostgres {
		if f.Postgres == "" || f.Table == "" {
			log.Fatal("-postgres and -table are required")
		}
		MustLoopbackDSN(f.Postgres)
	}
	return f
}

func mustLoopback(addr string) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		log.Fatalf("%s: %v", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		log.Fatalf("%s is not a loopback address", addr)
	}
}

// Stats are a server's counts since it started.
type Stats struct {
	Executions int64 `json:"executions"`  // the handler ran
	Answers    int64 `json:"answers"`     // answers on Path
	Created    int64 `json:"created"`     // of which 201
	Replayed   int64 `json:"replayed201"` // of which 201 and marked a replay by the middleware
	// Gone counts answers other than 201 written when the client had
	// gone: requests wrk cut off at the end of a run, whose middleware
	// gave up with the request's context.
	Gone int64 `json:"gone_not_201"`
	// Statements sent to the database (servers on PostgreSQL), in all
	// and by first word.
	Statements int64            `json:"statements,omitempty"`
	ByVerb     map[string]int64 `json:"statements_by_verb,omitempty"`
}

var executions, answers, created, replayed, gone atomic.Int64

// Execute counts one execution of the handler and returns its answer:
// 201's body, with an id that no other execution of the instance has, so
// that a replay is recognisable by its body too.
func Execute(instance string) []byte {
	n := executions.Add(1)
	b := make([]byte, 0, 48)
	b = append(b, `{"id":"`...)
	b = append(b, instance...)
	b = append(b, '-')
	b = strconv.AppendInt(b, n, 10)
	return append(b, `","status":"created"}`...)
}

// Answered counts one answer on Path.
func Answered(status int, replay bool) {
	answers.Add(1)
	if status == http.StatusCreated {
		created.Add(1)
		if replay {
			replayed.Add(1)
		}
	}
}

// Current returns the counts.
func Current() Stats {
	s := Stats{Executions: executions.Load(), Answers: answers.Load(), Created: created.Load(), Replayed: replayed.Load(),
		Gone: gone.Load()}
	s.Statements, s.ByVerb = statementCounts()
	return s
}

// StatsJSON is the body of StatsPath.
func StatsJSON() []byte {
	b, _ := json.Marshal(Current())
	return b
}

// Handler is the trivial handler, for net/http servers.
func Handler(instance string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := Execute(instance)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
	})
}

// Serve runs a net/http server with h behind Path until the lifetime ends.
// replayHeader names the header by which the middleware marks a replay
// ("" when there is no middleware).
func Serve(f Flags, h http.Handler, replayHeader string) {
	mux := http.NewServeMux()
	mux.Handle("POST "+Path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &countingWriter{ResponseWriter: w, replayHeader: replayHeader}
		h.ServeHTTP(cw, r)
		if cw.status != http.StatusCreated && r.Context().Err() != nil {
			gone.Add(1)
		}
	}))
	mux.HandleFunc("GET "+StatsPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(StatsJSON())
	})
	l, err := net.Listen("tcp", f.Addr)
	if err != nil {
		log.Fatal(err)
	}
	server := &http.Server{Handler: mux}
	time.AfterFunc(f.Lifetime, func() { server.Close() })
	if err := server.Serve(l); err != http.ErrServerClosed {
		log.Fatal(err)
	}
}

// countingWriter counts the answer as its status is written.
type countingWriter struct {
	http.ResponseWriter
	replayHeader string
	wrote        bool
	status       int
}

func (w *countingWriter) WriteHeader(status int) {
	if !w.wrote {
		w.wrote, w.status = true, status
		Answered(status, w.replayHeader != "" && w.Header().Get(w.replayHeader) == "true")
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *countingWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
