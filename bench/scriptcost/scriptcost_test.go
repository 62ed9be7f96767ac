// Package scriptcost measures what each script of a first execution costs
// Redis itself: this library's claim and completion (lua/ in the root, as
// the library ships them) beside the floor's (bench/peers/floor). The
// scripts go out pipelined, 200 to a round trip, so that the figure is the
// scripts' own work rather than a wake-up per call, and the CPU is Redis's
// (INFO cpu) over the timed keys only:
//
//	go test ./bench/scriptcost -run '^$' -bench . -count 6
//
// redis-µs/op is the figure; ns/op is the client's wall time.
package scriptcost

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceonly/idempotency/bench/peers/floor/floorlua"
	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.Main(m) }

const (
	batch  = 200
	ttlMS  = 86_400_000
	header = "\x01\x0cContent-Type\x10application/json"
	body   = `{"id":"3f6c2a9e-1b7d-4c55-9e8a-0a1b2c3d4e5f","status":"created"}`
)

var fingerprint = func() string { s := sha256.Sum256([]byte("POST /payments")); return hex.EncodeToString(s[:]) }()

// A contender's scripts, and how it calls them for key i.
type contender struct {
	name            string
	claim, complete *redis.Script
	// completeKeys: the record and the lock, and this library's waiters flag.
	completeKeys int
	// lockedApart: the lock is taken by a script of its own before the
	// claim (the floor's redislock), which is not measured here; this
	// library's claim takes it itself.
	lockedApart  bool
	claimArgs    func(lock string) []any
	completeArgs func(lock string, claimed *redis.Cmd) []any
	// answered reports whether a phase's reply is the one that phase
	// exists to measure (a claim that claimed, a completion that stored,
	// a duplicate answered with the record).
	answered func(phase string, reply any) bool
}

func contenders(b *testing.B) []contender {
	read := func(name string) *redis.Script {
		src, err := os.ReadFile("../../lua/" + name)
		if err != nil {
			b.Fatal(err)
		}
		return keyspace.RecordScript(string(src)) // as the middleware builds it
	}
	return []contender{
		{
			name: "library", claim: read("claim.lua"), complete: read("complete.lua"), completeKeys: 3,
			claimArgs: func(lock string) []any { return []any{lock, fingerprint, ttlMS, "", "0", 37000, 3000} },
			completeArgs: func(lock string, claimed *redis.Cmd) []any {
				reply, _ := claimed.Slice()
				fence, _ := reply[1].(string)
				run := keyspace.Record{State: "run", Fingerprint: fingerprint, Owner: lock, Fence: fence, Executions: "1"}
				done := run
				done.State, done.Status, done.Header, done.Body = "done", "201", header, body
				return []any{lock, done.String(), ttlMS, run.String()}
			},
			answered: func(phase string, reply any) bool {
				r, _ := reply.([]any)
				switch phase {
				case "claim":
					return len(r) == 2 && r[0] == "claimed"
				case "complete":
					return reply == int64(1)
				}
				return len(r) == 3 && r[0] == "done"
			},
		},
		{
			name: "floor", claim: floorlua.Claim, complete: floorlua.Complete, completeKeys: 2, lockedApart: true,
			claimArgs: func(lock string) []any { return []any{lock, ttlMS} },
			completeArgs: func(lock string, _ *redis.Cmd) []any {
				return []any{lock, "d" + fingerprint + "201\x10application/json" + body, ttlMS}
			},
			answered: func(phase string, reply any) bool {
				switch phase {
				case "claim":
					fence, _ := reply.(int64)
					return fence > 0
				case "complete":
					return reply == int64(1)
				}
				record, _ := reply.(string)
				return strings.HasPrefix(record, "d")
			},
		},
	}
}

func BenchmarkScripts(b *testing.B) {
	rdb := redistest.Private(b).Client(b)
	ctx := context.Background()
	for _, c := range contenders(b) {
		for _, phase := range []string{"claim", "complete", "duplicate"} {
			b.Run(c.name+"/"+phase, func(b *testing.B) {
				for _, err := range []error{rdb.FlushAll(ctx).Err(), c.claim.Load(ctx, rdb).Err(), c.complete.Load(ctx, rdb).Err()} {
					if err != nil {
						b.Fatal(err)
					}
				}
				keys := func(i int) []string {
					tag := "{" + strconv.Itoa(i) + "}"
					return []string{"r" + tag, "l" + tag, "w" + tag}
				}
				lock := func(i int) string { return fmt.Sprintf("lock-value-%012d", i) }
				n := b.N
				// Untimed: every key's lock where the contender takes it
				// apart, and what the phase starts from.
				if c.lockedApart {
					pipelined(b, rdb, n, func(p redis.Pipeliner, i int) *redis.Cmd {
						p.Set(ctx, keys(i)[1], lock(i), time.Minute)
						return nil
					})
				}
				var claims []*redis.Cmd
				if phase != "claim" {
					claims = pipelined(b, rdb, n, func(p redis.Pipeliner, i int) *redis.Cmd {
						return c.claim.EvalSha(ctx, p, keys(i)[:2], c.claimArgs(lock(i))...)
					})
				}
				if phase == "duplicate" {
					pipelined(b, rdb, n, func(p redis.Pipeliner, i int) *redis.Cmd {
						return c.complete.EvalSha(ctx, p, keys(i)[:c.completeKeys], c.completeArgs(lock(i), claims[i])...)
					})
				}
				before := redisCPU(b, rdb)
				b.ResetTimer()
				timed := pipelined(b, rdb, n, func(p redis.Pipeliner, i int) *redis.Cmd {
					switch phase {
					case "claim":
						return c.claim.EvalSha(ctx, p, keys(i)[:2], c.claimArgs(lock(i))...)
					case "complete":
						return c.complete.EvalSha(ctx, p, keys(i)[:c.completeKeys], c.completeArgs(lock(i), claims[i])...)
					}
					return c.claim.EvalSha(ctx, p, keys(i)[:2], c.claimArgs("another-lock-value")...)
				})
				b.StopTimer()
				for _, cmd := range []*redis.Cmd{timed[0], timed[n-1]} {
					if !c.answered(phase, cmd.Val()) {
						b.Fatalf("%s answered %v", phase, cmd.Val())
					}
				}
				b.ReportMetric((redisCPU(b, rdb)-before).Seconds()*1e6/float64(n), "redis-µs/op")
			})
		}
	}
}

// pipelined sends one command per key i < n, batch to a round trip, and
// fails b on any error but a nil reply.
func pipelined(b *testing.B, rdb *redis.Client, n int, send func(p redis.Pipeliner, i int) *redis.Cmd) []*redis.Cmd {
	ctx := context.Background()
	out := make([]*redis.Cmd, n)
	for start := 0; start < n; start += batch {
		p := rdb.Pipeline()
		for i := start; i < min(start+batch, n); i++ {
			out[i] = send(p, i)
		}
		cmds, _ := p.Exec(ctx)
		for _, cmd := range cmds {
			if err := cmd.Err(); err != nil && err != redis.Nil {
				b.Fatal(err)
			}
		}
	}
	return out
}

// redisCPU is the CPU time Redis has used, user and system.
func redisCPU(b *testing.B, rdb *redis.Client) time.Duration {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		name, value, _ := strings.Cut(line, ":")
		if name == "used_cpu_sys" || name == "used_cpu_user" {
			v, _ := strconv.ParseFloat(value, 64)
			total += v
		}
	}
	return time.Duration(total * float64(time.Second))
}
