// Package keyspace is the operator's view of the middleware's records, in
// Redis or in an SQL table: how a key's record, lock and waiters flag are
// named, what inspect.lua reads of them and how settle.lua settles an
// interrupted one (sqlrows.go: their twins on a table's rows). The
// middleware hands a Store to package admin; both read the layout here.
package keyspace

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/inspect.lua
	inspectSource string
	//go:embed lua/settle.lua
	settleSource string

	inspectScript = RecordScript(inspectSource)
	settleScript  = RecordScript(settleSource)
)

// A Store is one middleware's records, as the operator sees them: in
// Redis (Client) or, for a middleware made by NewSQL, in a table (SQL).
type Store struct {
	Client    redis.UniversalClient
	SQL       *SQLRows
	Prefix    string
	RecordTTL time.Duration
	// Horizon is the middleware's claim horizon: how long after its claim
	// an executor whose lock lapsed may still store its answer (a stalled
	// Redis or a paused process lets a live run's lock run out). Until it
	// has passed, a claimed key is running, not interrupted, unless its
	// run ended kept.
	Horizon time.Duration
	// Record turns an answer into the record fields the middleware would
	// store for it: its state ("done", or "big" when it is not replayable),
	// status, header block and body; or why no replay could read it.
	Record func(status int, header http.Header, body []byte, notReplayable bool) (state string, recStatus int, recHeader string, recBody []byte, err error)
	// KeyReused is the error an answer for another request wraps.
	KeyReused error
}

// ScriptHashes are the SHA1 digests of the scripts, for tests that drop
// their replies.
func ScriptHashes() (inspect, settle string) { return inspectScript.Hash(), settleScript.Hash() }

// LoadScripts loads the scripts into c's script cache.
func LoadScripts(ctx context.Context, c redis.Scripter) error {
	if err := inspectScript.Load(ctx, c).Err(); err != nil {
		return err
	}
	return settleScript.Load(ctx, c).Err()
}

// errNoStore is returned by a Store that names neither Redis nor a table.
var errNoStore = errors.New("admin: the middleware names no store (neither a Redis client nor an SQL table)")

// ErrNotInterrupted is returned by Resolve and Forget for a key that is not
// interrupted by the claim they were given (it has no record or a
// forgotten one, its answer is stored, its executor holds its lock, or it
// was claimed anew); they have changed nothing.
var ErrNotInterrupted = errors.New("admin: key is not interrupted")

// State is what Redis or the SQL table holds for one key, read in one
// step (admin.KeyState).
type State struct {
	// Key names the key's record, as the middleware's log lines and
	// idempotency.Execution.Key (an outcome store's primary key) do.
	Key string
	// State is "run" (claimed, no answer stored yet), "done" (an answer
	// is stored), "big" (executed, its answer not replayable) or "none"
	// (no record: never claimed, expired, or forgotten), or "corrupt" (a
	// record it cannot read).
	State string
	// Interrupted: claimed, nobody holds the lock under the value it was
	// claimed with, and its executor can store no answer any more: its run
	// ended kept, or the claim horizon has passed since its claim. Retries
	// are answered 409 interrupted (or recovered, with an outcome store).
	Interrupted bool
	// Fingerprint is the claiming request's, in hex.
	Fingerprint string
	// Fence is the fencing token of the key's latest execution, and
	// Executions how many executions it has had.
	Fence      uint64
	Executions int64
	// Status and BodySize describe the stored answer ("done").
	Status   int
	BodySize int64
	// TTL is the record's remaining lifetime.
	TTL time.Duration
	// Owner is the lock value the latest execution claimed the key with;
	// Lock is the value the lock holds now ("" when free), for LockTTL.
	// In SQL the lock is the row's lease (its holder), read on the
	// database's clock.
	Owner, Lock string
	LockTTL     time.Duration
	// Waiting: another instance waits for the lock. Always false in SQL,
	// where waiters poll and leave no mark.
	Waiting bool
}

// Inspect reads the key named key: its record's name (State.Key), or
// the name of its lock or waiters flag.
func (s *Store) Inspect(ctx context.Context, key string) (State, error) {
	if s.Client == nil && s.SQL == nil {
		return State{}, errNoStore
	}
	k, err := Parse(s.Prefix, key)
	if err != nil {
		return State{}, err
	}
	if s.SQL != nil {
		return s.SQL.inspect(ctx, k.Record, s.Horizon)
	}
	return stateOf(k, inspectScript.Run(ctx, s.Client, k.operated()), s.Horizon)
}

// scanPage is how many keys one SCAN step looks at, and so the most a
// step's reply and its inspection carry.
const scanPage = 1000

// Interrupted yields every interrupted key under the prefix, a SCAN page
// per step on every master, or a page of the table's rows per step
// (admin.Operator.Interrupted).
func (s *Store) Interrupted(ctx context.Context) iter.Seq2[State, error] {
	if s.SQL != nil {
		return s.SQL.interrupted(ctx, s.Prefix, s.Horizon)
	}
	return func(yield func(State, error) bool) {
		if s.Client == nil {
			yield(State{}, errNoStore)
			return
		}
		nodes, err := keyspaces(ctx, s.Client)
		if err != nil {
			yield(State{}, err)
			return
		}
		match := globEscape(s.Prefix) + ":{*}:r*"
		seen := map[string]bool{} // SCAN may return a key twice
		for _, node := range nodes {
			// Once per node: each page's pipeline sends EVALSHA, and a
			// script flushed mid-walk is loaded again by the fallback in
			// inspectPage.
			if err := inspectScript.Load(ctx, node).Err(); err != nil {
				yield(State{}, err)
				return
			}
			for cursor := uint64(0); ; {
				names, next, err := node.Scan(ctx, cursor, match, scanPage).Result()
				if err != nil {
					yield(State{}, err)
					return
				}
				states, err := s.inspectPage(ctx, node, names)
				if err != nil {
					yield(State{}, err)
					return
				}
				for _, s := range states {
					if s.Interrupted && !seen[s.Key] {
						seen[s.Key] = true
						if !yield(s, nil) {
							return
						}
					}
				}
				if cursor = next; cursor == 0 {
					break
				}
			}
		}
	}
}

// inspectPage inspects the records among names, which node holds, in one
// pipeline.
func (s *Store) inspectPage(ctx context.Context, node redis.UniversalClient, names []string) ([]State, error) {
	var records []Names
	for _, name := range names {
		if k, err := Parse(s.Prefix, name); err == nil && k.Record == name {
			records = append(records, k)
		}
	}
	if len(records) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.Cmd, len(records))
	// Errors are read per command below.
	node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range records {
			cmds[i] = inspectScript.EvalSha(ctx, p, k.operated())
		}
		return nil
	})
	states := make([]State, 0, len(records))
	for i, k := range records {
		cmd := cmds[i]
		if cmd.Err() != nil {
			// Once more through the client itself, which loads the
			// script again (a SCRIPT FLUSH) and follows a key that moved
			// to another master (a resharding).
			cmd = inspectScript.Run(ctx, s.Client, k.operated())
		}
		st, err := stateOf(k, cmd, s.Horizon)
		if err != nil {
			return nil, err
		}
		states = append(states, st)
	}
	return states, nil
}

// keyspaces returns clients whose keyspaces together hold every key: each
// master of a Cluster, each shard of a Ring, otherwise client itself.
func keyspaces(ctx context.Context, client redis.UniversalClient) ([]redis.UniversalClient, error) {
	var (
		mu    sync.Mutex
		nodes []redis.UniversalClient
	)
	collect := func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		nodes = append(nodes, c)
		mu.Unlock()
		return nil
	}
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, collect)
	case *redis.Ring:
		err = c.ForEachShard(ctx, collect)
	default:
		nodes = append(nodes, client)
	}
	return nodes, err
}

// globEscape quotes the characters that SCAN's MATCH reads as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\^`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Resolve settles the interrupted key st describes with an answer
// (admin.Operator.Resolve tells the whole contract).
func (s *Store) Resolve(ctx context.Context, st State, status int, header http.Header, body []byte, fingerprint string, notReplayable bool) error {
	switch {
	case status < 100 || status > 999:
		return fmt.Errorf("admin: %d is not an HTTP status", status)
	case status < 200:
		// net/http sends 103 ahead of an implicit 200 and 101 as a switch
		// of protocols: the key would replay a status nobody gave it.
		return fmt.Errorf("admin: %d is an interim (1xx) status, never a final answer's; an answer's status is 200 to 999", status)
	}
	var fp string
	if fingerprint != "" {
		b, err := hex.DecodeString(fingerprint)
		if err != nil || len(b) != sha256.Size {
			return fmt.Errorf("admin: fingerprint %q is not %d bytes in hex", fingerprint, sha256.Size)
		}
		fp = hex.EncodeToString(b) // as the record holds it: lower case
	}
	state, recStatus, recHeader, recBody, err := s.Record(status, header, body, notReplayable)
	if err != nil {
		return err
	}
	return s.settle(ctx, st, settlement{state: state, status: strconv.Itoa(recStatus), header: recHeader,
		body: string(recBody), fingerprint: fp})
}

// Forget settles the interrupted key st describes by deleting its record
// (admin.Operator.Forget).
func (s *Store) Forget(ctx context.Context, st State) error {
	return s.settle(ctx, st, settlement{forget: true})
}

// settle runs settle.lua (or its twin on the table's row) on the key st
// describes, for the claim st saw: a key claimed anew since may be
// running, stalled past its lease.
func (s *Store) settle(ctx context.Context, st State, a settlement) error {
	if s.Client == nil && s.SQL == nil {
		return errNoStore
	}
	k, err := Parse(s.Prefix, st.Key)
	if err != nil {
		return err
	}
	if !st.Interrupted || st.Owner == "" {
		return fmt.Errorf("%w: %s was not interrupted when it was inspected", ErrNotInterrupted, k.Record)
	}
	a.owner, a.ttl, a.horizon = st.Owner, s.RecordTTL, s.Horizon
	var reply string
	if s.SQL != nil {
		reply, err = s.SQL.settle(ctx, k.Record, a)
	} else {
		args := []any{"answer", a.owner, a.ttl.Milliseconds(), a.horizon.Milliseconds(), a.state, a.status, a.header, a.body, a.fingerprint}
		if a.forget {
			args = []any{"forget", a.owner, a.ttl.Milliseconds(), a.horizon.Milliseconds()}
		}
		reply, err = settleScript.Run(ctx, s.Client, k.operated(), args...).Text()
	}
	if err != nil {
		return err
	}
	switch reply {
	case "settled":
		return nil
	case "none":
		return fmt.Errorf("%w: %s has no record (never claimed, expired, or forgotten)", ErrNotInterrupted, k.Record)
	case "done":
		return fmt.Errorf("%w: %s has a stored answer", ErrNotInterrupted, k.Record)
	case "big":
		return fmt.Errorf("%w: %s was executed, and its answer was not replayable", ErrNotInterrupted, k.Record)
	case "running":
		return fmt.Errorf("%w: %s is running: its executor holds the lock", ErrNotInterrupted, k.Record)
	case "young":
		return fmt.Errorf("%w: %s may still be running: its lock lapsed, but its executor may store its answer "+
			"until the claim horizon (%s after its claim) has passed", ErrNotInterrupted, k.Record, s.Horizon)
	case "corrupt":
		return fmt.Errorf("%w: %s holds a record that cannot be read", ErrNotInterrupted, k.Record)
	case "changed":
		return fmt.Errorf("%w: %s was claimed anew since it was inspected", ErrNotInterrupted, k.Record)
	case "mismatch":
		return fmt.Errorf("%w: the answer is not for the request that claimed %s (fingerprints differ)", s.KeyReused, k.Record)
	}
	return fmt.Errorf("admin: unexpected settle reply %q", reply)
}

// stateOf reads inspect.lua's reply, whose last two values are Redis's
// clock (TIME), against which a key's claim is as old as it is.
func stateOf(k Names, cmd *redis.Cmd, horizon time.Duration) (State, error) {
	r, err := cmd.Slice()
	if err != nil {
		return State{}, err
	}
	if len(r) != 13 {
		return State{}, fmt.Errorf("admin: unexpected inspect reply of %d values", len(r))
	}
	text := func(i int) string { s, _ := r[i].(string); return s }
	number := func(i int) int64 { n, _ := r[i].(int64); return n }
	s := State{
		Key: k.Record, State: text(0), Owner: text(1),
		Fingerprint: text(2),
		BodySize:    number(6), TTL: remaining(number(7)),
		Lock: text(8), LockTTL: remaining(number(9)), Waiting: number(10) == 1,
	}
	if s.State == "" || s.State == "forgotten" {
		s.State = "none"
	}
	s.Status, _ = strconv.Atoi(text(3))
	s.Executions, _ = strconv.ParseInt(text(4), 10, 64)
	s.Fence, _ = strconv.ParseUint(text(5), 10, 64)
	sec, _ := strconv.ParseInt(text(11), 10, 64)
	usec, _ := strconv.ParseInt(text(12), 10, 64)
	s.Interrupted = interrupted(s, sec*1e6+usec, horizon)
	return s, nil
}

// interrupted reports whether the key s describes is interrupted, at now
// (microseconds on the clock that wrote its fence): claimed, nobody holds
// the lock under its claim's value, and nobody can store an answer for it
// any more.
func interrupted(s State, now int64, horizon time.Duration) bool {
	return s.State == "run" && s.Lock != s.Owner && !mayStillStore(s.Owner, int64(s.Fence), now, horizon)
}

// mayStillStore reports whether the executor of a claim under owner, with
// fence, may still store its answer at now, its lock lapsed or not: a run
// that ended kept says it will not (keep marks its lock value with '!');
// any other may be live (a stalled Redis, a paused process) until the
// claim horizon has passed since its claim. The rule is the claim's
// (claim.lua, and its twin on SQL rows).
func mayStillStore(owner string, fence, now int64, horizon time.Duration) bool {
	return !strings.HasPrefix(owner, "!") && now-fence < horizon.Microseconds()
}

// remaining turns a PTTL reply into a duration: 0 for a missing key, and
// negative for a key without a TTL (which the middleware never leaves).
func remaining(pttl int64) time.Duration {
	switch {
	case pttl == -2:
		return 0
	case pttl < 0:
		return -1
	}
	return time.Duration(pttl) * time.Millisecond
}

// An Operated is what package admin needs of a *idempotency.Middleware:
// its Store. The root package embeds it in Middleware under an unexported
// name, so that Middleware's API gains nothing; Go promotes the unexported
// method below to Middleware all the same, so that StoreOf, which package
// admin calls, takes the middleware itself, its type checked by the
// compiler, and no variable is set when a package is initialised.
type Operated struct{ store func() *Store }

// NewOperated returns the Operated whose Store store builds.
func NewOperated(store func() *Store) Operated { return Operated{store: store} }

func (o Operated) operatedStore() *Store { return o.store() }

// operable is implemented only by the types that embed an Operated.
type operable interface{ operatedStore() *Store }

// StoreOf returns the Store of m, a *idempotency.Middleware.
func StoreOf(m operable) *Store { return m.operatedStore() }
