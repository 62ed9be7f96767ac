//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/example/internal/bank"
	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
	"github.com/redis/go-redis/v9"
)

// The crash trials: protected transfers on two server processes, one of
// which dies by SIGKILL at every point of a request again and again, while
// every request is retried on the other until it is answered. They prove
// what the outcome store promises: no transfer runs twice, no answer is
// lost or differs from the committed one, and no key is left interrupted.

func TestMain(m *testing.M) { redistest.Main(m) }

// A trial is what one run does to the servers.
type trial struct {
	// keysInSQL: the servers keep their keys in the bank's database
	// (idempotency.NewSQL, KEYS=sql), with no Redis at all.
	keysInSQL bool
	requests  int
	workers   int
	// killAt is the victim's KILL_AT: the fraction of the requests that
	// reach each point on which it dies there.
	killAt string
	// randomKills: the test also kills the victim at random moments,
	// cutting whatever it has in flight.
	randomKills bool
	// flushes: FLUSHALL on Redis this many times, evenly through the run.
	flushes int
	// hedged is the fraction of requests sent to both servers at once, so
	// that two executions of one key meet (in SQL, once Redis forgot).
	hedged float64
	// outages: Redis unreachable for the servers this many times, for
	// outageFor each, evenly through the run. Requests in flight then lose
	// their leases or cannot store their answers; new ones are refused
	// (503, fail closed). After the run every request is sent once more
	// and must get its one answer again, so that an answer committed in
	// SQL but never stored in Redis counts as lost unless it is recovered.
	outages   int
	outageFor time.Duration
	// slow is the servers' SLOW (see main.go): transfers that take long
	// enough for an outage to cut them off.
	slow string
	// within bounds the whole run; requests unanswered by then are lost.
	within time.Duration
	// minKills is how often the victim must have died at each point for
	// the trial to count as a test of that point.
	minKills int
}

// Requests per database: SQLite runs the full thousand; the servers
// share their two cores with the database's own processes, so PostgreSQL
// and MariaDB run fewer to keep the suite's time in bounds.
var requestsFor = map[sqltest.Kind]int{sqltest.SQLite: 1000, sqltest.PostgreSQL: 1000, sqltest.MySQL: 1000}

func TestCrashTrials(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a server and kills it some hundred times")
	}
	bin := buildServer(t, t.TempDir())
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		n := requestsFor[d.Kind]
		t.Run("kills", func(t *testing.T) {
			runTrial(t, bin, d, trial{
				requests: n, workers: 8, randomKills: true, within: 80 * time.Second, minKills: 5,
				killAt: "before=0.04,inside=0.04,committed=0.04,stored=0.04",
			})
		})
		t.Run("redis-flushed", func(t *testing.T) {
			runTrial(t, bin, d, trial{
				requests: n, workers: 8, randomKills: true, flushes: 8, hedged: 0.25, within: 80 * time.Second,
				killAt: "before=0.015,inside=0.015,committed=0.015,stored=0.015",
			})
		})
		t.Run("redis-unreachable", func(t *testing.T) {
			runTrial(t, bin, d, trial{
				requests: n, workers: 8, randomKills: true, outages: 5, outageFor: 1500 * time.Millisecond,
				hedged: 0.1, within: 120 * time.Second, slow: "0.04:450ms",
				killAt: "before=0.015,inside=0.015,committed=0.015,stored=0.015",
			})
		})
		// The kills again with the keys in the same database as the
		// outcomes and no Redis: the claim, the lease and the stored
		// answer are rows of the keys table, and "stored" dies after the
		// answer is stored there. The Redis variants (flushed,
		// unreachable) have no counterpart here.
		t.Run("keys-in-sql", func(t *testing.T) {
			runTrial(t, bin, d, trial{
				keysInSQL: true, requests: n, workers: 8, randomKills: true, within: 80 * time.Second, minKills: 5,
				killAt: "before=0.04,inside=0.04,committed=0.04,stored=0.04",
			})
		})
	})
}

// A transferRequest is one protected request and what became of it.
type transferRequest struct {
	key, body string
	from, to  string
	amount    int64

	attempts int
	answered bool
	answer   string // the body of its 201
	failure  string // why it was given up
}

// hedge sends r to both servers at once and merges what became of both
// sends: answered when both were, with the one answer both must have got.
func hedge(ctx context.Context, client *http.Client, r *transferRequest, victim, survivor *instance, counts *tally) {
	twin := *r
	var wg sync.WaitGroup
	wg.Go(func() { send(ctx, client, &twin, survivor, survivor, counts) })
	send(ctx, client, r, victim, survivor, counts)
	wg.Wait()
	r.attempts += twin.attempts
	switch {
	case !twin.answered:
		r.answered, r.failure = false, "its twin: "+twin.failure
	case r.answered && twin.answer != r.answer:
		r.answered, r.failure = false, fmt.Sprintf("two answers: %s and %s", r.answer, twin.answer)
	}
}

// tally counts what the clients saw.
type tally struct {
	transport, inProgress, unavailable, interrupted, other atomic.Int64
}

// openBank sets up a bank with seed's accounts on d, in tables of its own
// that are dropped when t ends, and returns it with its table prefix and
// the environment that points a server at it.
func openBank(t *testing.T, d *sqltest.DB, seed map[string]int64) (b *bank.Bank, prefix string, env []string) {
	prefix = d.Table(t, "trial") + "_"
	t.Cleanup(func() {
		for _, table := range []string{"accounts", "transfers", sqlidem.DefaultTable, keysTable} {
			d.Exec("DROP TABLE IF EXISTS " + prefix + table)
		}
	})
	b, err := bank.New(d.DB, d.Dialect, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Setup(t.Context(), seed); err != nil {
		t.Fatal(err)
	}
	env = []string{"TABLE_PREFIX=" + prefix}
	switch d.Kind {
	case sqltest.SQLite:
		path, _, _ := strings.Cut(strings.TrimPrefix(d.DSN, "file:"), "?")
		env = append(env, "DB_PATH="+path)
	case sqltest.PostgreSQL:
		env = append(env, "DATABASE_URL="+d.DSN)
	case sqltest.MySQL:
		env = append(env, "DATABASE_URL=mysql://"+d.DSN)
	}
	return b, prefix, env
}

func runTrial(t *testing.T, bin string, d *sqltest.DB, tr trial) {
	ctx := t.Context()
	seed := map[string]int64{}
	var ids []string
	for i := range 6 {
		id := fmt.Sprint("acct-", i)
		seed[id], ids = 1_000_000_000, append(ids, id)
	}
	b, prefix, env := openBank(t, d, seed)

	var (
		rs   *redistest.Server
		link *redisLink
	)
	if tr.keysInSQL {
		env = append(env, "KEYS=sql", "REDIS_URL=")
	} else {
		rs = redistest.Private(t)
		redisAddr := rs.Addr()
		if tr.outages > 0 {
			link = newRedisLink(t, rs.Addr())
			redisAddr = link.addr()
		}
		env = append(env, "KEYS=redis", "REDIS_URL=redis://"+redisAddr)
	}
	env = append(env, "LOCK_LEASE=400ms", "SLOW="+tr.slow)
	killLog := filepath.Join(t.TempDir(), "kills.log")
	victim := newInstance(t, bin, "victim", append(env, "KILL_AT="+tr.killAt, "KILL_LOG="+killLog)...)
	survivor := newInstance(t, bin, "survivor", env...)
	victim.keepAlive(t)
	survivor.keepAlive(t)

	newTransfer := func(i int) *transferRequest {
		from := rand.IntN(len(ids))
		to := (from + 1 + rand.IntN(len(ids)-1)) % len(ids)
		r := &transferRequest{key: fmt.Sprintf("trial-%05d", i), from: ids[from], to: ids[to], amount: 1 + rand.Int64N(10_000)}
		r.body = fmt.Sprintf(`{"from":%q,"to":%q,"amount":%d}`, r.from, r.to, r.amount)
		return r
	}
	reqs := make([]*transferRequest, tr.requests)
	for i := range reqs {
		reqs[i] = newTransfer(i)
	}

	began := time.Now()
	runCtx, cancel := context.WithTimeout(ctx, tr.within)
	defer cancel()
	var (
		counts      tally
		answered    atomic.Int64
		randomKills atomic.Int64
		flushed     atomic.Int64
		outages     atomic.Int64
		hedged      atomic.Int64
		background  sync.WaitGroup
		stopBg      = make(chan struct{})
		toppingUp   atomic.Bool // the random kills rest (see below)
	)
	if tr.randomKills {
		background.Go(func() {
			for {
				select {
				case <-stopBg:
					return
				case <-time.After(time.Duration(150+rand.IntN(750)) * time.Millisecond):
				}
				if !toppingUp.Load() && victim.kill() {
					randomKills.Add(1)
				}
			}
		})
	}
	if tr.flushes > 0 {
		rdb := rs.Client(t)
		background.Go(func() {
			for next := 1; next <= tr.flushes; {
				select {
				case <-stopBg:
					return
				case <-time.After(5 * time.Millisecond):
				}
				if answered.Load() >= int64(next*tr.requests/(tr.flushes+1)) {
					if err := rdb.FlushAll(context.Background()).Err(); err != nil {
						t.Errorf("FLUSHALL: %v", err)
					}
					flushed.Add(1)
					next++
				}
			}
		})
	}

	if tr.outages > 0 {
		background.Go(func() {
			for next := 1; next <= tr.outages; {
				select {
				case <-stopBg:
					return
				case <-time.After(5 * time.Millisecond):
				}
				if answered.Load() >= int64(next*tr.requests/(tr.outages+1)) {
					link.cut()
					select {
					case <-stopBg:
					case <-time.After(tr.outageFor):
					}
					link.mend()
					outages.Add(1)
					next++
				}
			}
		})
	}

	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: tr.workers}}
	queue := make(chan *transferRequest)
	var workers sync.WaitGroup
	for range tr.workers {
		workers.Go(func() {
			for r := range queue {
				if rand.Float64() < tr.hedged {
					hedged.Add(1)
					hedge(runCtx, client, r, victim, survivor, &counts)
				} else {
					send(runCtx, client, r, victim, survivor, &counts)
				}
				if r.answered {
					answered.Add(1)
				}
			}
		})
	}
	for _, r := range reqs {
		queue <- r
	}
	// A trial that must test each kill point goes on while one has died
	// too seldom: on a busy machine the victim restarts slowly, is down
	// for much of the random kills' rhythm, serves fewer requests, and so
	// dies at each point less often. The random kills rest meanwhile, and
	// the victim's next lives die only at the points still short, and
	// more often there. Up to four times the requests, within three
	// quarters of the trial's time (the last hundred then have a quarter
	// to be answered: a busy machine can take half of it for the first
	// thousand).
	for tr.minKills > 0 && len(reqs) < 4*tr.requests && time.Since(began) < tr.within*3/4 {
		short := killsShort(killCounts(t, killLog), tr.minKills)
		if short == "" {
			break
		}
		toppingUp.Store(true)
		victim.setEnv("KILL_AT", short)
		for range 100 {
			r := newTransfer(len(reqs))
			reqs = append(reqs, r)
			queue <- r
		}
	}
	close(queue)
	workers.Wait()
	close(stopBg)
	background.Wait()
	duration := time.Since(began)
	if tr.outages > 0 {
		// Every request once more, to the survivor: each must get its
		// one answer, replayed from Redis or recovered from SQL.
		recheck, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		for _, r := range reqs {
			if !r.answered {
				continue
			}
			again := &transferRequest{key: r.key, body: r.body}
			send(recheck, client, again, survivor, survivor, &counts)
			if !again.answered || again.answer != r.answer {
				r.answered = false
				r.failure = fmt.Sprintf("answered %q, then %q (%s)", r.answer, again.answer, again.failure)
			}
		}
	}
	victim.stop()
	survivor.stop()

	// What the database holds.
	_, transfersTable := b.Tables()
	outcomes := map[string]bool{} // committed answer bodies
	doneRows, otherRows := 0, 0
	rows, err := d.QueryContext(ctx, "SELECT state, body FROM "+prefix+sqlidem.DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var state string
		var body []byte
		if err := rows.Scan(&state, &body); err != nil {
			t.Fatal(err)
		}
		if state == "done" {
			doneRows++
			outcomes[string(body)] = true
		} else {
			otherRows++
		}
	}
	rows.Close()
	type row struct {
		from, to string
		amount   int64
	}
	transfers := map[string]row{}
	rows, err = d.QueryContext(ctx, "SELECT id, from_account, to_account, amount FROM "+transfersTable)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var r row
		if err := rows.Scan(&id, &r.from, &r.to, &r.amount); err != nil {
			t.Fatal(err)
		}
		transfers[id] = r
	}
	rows.Close()
	balances := map[string]int64{}
	accounts, err := b.Accounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range accounts {
		balances[a.ID] = a.Balance
	}

	// Every request's answer against the database.
	var lost, notCommitted, wrongTransfer int
	want := map[string]int64{}
	for id, v := range seed {
		want[id] = v
	}
	answeredIDs := map[string]bool{}
	attempts := 0
	for _, r := range reqs {
		attempts += r.attempts
		if !r.answered {
			lost++
			if lost <= 5 {
				t.Errorf("%s: no answer after %d attempts: %s", r.key, r.attempts, r.failure)
			}
			continue
		}
		want[r.from] -= r.amount
		want[r.to] += r.amount
		if !outcomes[r.answer] {
			notCommitted++
			if notCommitted <= 5 {
				t.Errorf("%s: answered %s, which is no committed answer", r.key, r.answer)
			}
			continue
		}
		var receipt bank.Receipt
		json.Unmarshal([]byte(r.answer), &receipt)
		got, ok := transfers[receipt.Transfer.ID]
		if !ok || got != (row{r.from, r.to, r.amount}) || answeredIDs[receipt.Transfer.ID] {
			wrongTransfer++
			t.Errorf("%s: answered transfer %q, which the database holds as %+v (found %v, answered before %v)",
				r.key, receipt.Transfer.ID, got, ok, answeredIDs[receipt.Transfer.ID])
		}
		answeredIDs[receipt.Transfer.ID] = true
	}
	doubleWrites := len(transfers) - len(reqs)
	if doubleWrites != 0 || doneRows != len(reqs) || otherRows != 0 {
		t.Errorf("%d requests: %d transfers written, %d outcome rows done and %d others", len(reqs), len(transfers), doneRows, otherRows)
	}
	for id, v := range want {
		if balances[id] != v {
			t.Errorf("account %s holds %d; the answered transfers leave %d", id, balances[id], v)
		}
	}
	if n := counts.interrupted.Load(); n > 0 {
		t.Errorf("%d answers were 409 interrupted", n)
	}

	// What the keys' store holds: no key left claimed without its lock
	// (in SQL, its live lease), and how many executions were taken over.
	// A record left in state run without its lock is no wrong answer: under
	// the outcome store the next request with its key takes it over and
	// recovers the committed answer. Undoing a takeover hands a key back to
	// the executor it was taken from, which the victim's kills can leave
	// so; every answer above is still checked. It is counted, not failed.
	keysIn := "Redis"
	var orphans, takenOver int
	if tr.keysInSQL {
		keysIn = "SQL"
		orphans, takenOver = sqlRecords(t, d, prefix+keysTable)
	} else {
		orphans, takenOver = redisRecords(t, rs.Client(t))
	}
	if orphans > 0 {
		t.Logf("%d %s records left in state run without their lock (taken over by the next request)", orphans, keysIn)
	}
	kills := killCounts(t, killLog)
	if t.Failed() {
		for _, in := range []*instance{victim, survivor} {
			raw, _ := os.ReadFile(in.logs.Name())
			for line := range strings.Lines(string(raw)) {
				if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
					t.Logf("%s: %s", filepath.Base(in.logs.Name()), strings.TrimSpace(line))
				}
			}
		}
	}
	recovered, reran := logCounts(t, victim.logs.Name(), survivor.logs.Name())
	logs := []string{victim.logs.Name(), survivor.logs.Name()}
	unstored := logCount(t, logs, "its answer could not be stored yet")
	cut := logCount(t, logs, "a transfer did not commit", "lock lost")
	if lives := survivor.lives.Load(); lives != 1 {
		t.Errorf("the survivor had %d lives; it is never killed", lives)
	}
	for _, point := range []string{before, inside, committed, stored} {
		if kills[point] < tr.minKills {
			t.Errorf("%d kills at %s: too few to test it", kills[point], point)
		}
	}
	t.Logf("%v, keys in %s: %d requests in %v; kills: before %d, inside %d, committed %d, stored %d, at random %d (%d lives); "+
		"Redis flushed %d times, unreachable %d times, %d requests hedged; %d retries (%d transport errors, %d in-progress, %d unavailable, %d other); "+
		"recoveries: %d records taken over, %d committed answers recovered, %d reruns after nothing committed; "+
		"%d answers not stored in the keys' store at once, %d transfers cut off by a lost lease; "+
		"double writes %d, lost answers %d, answers not committed %d, wrong transfers %d, interrupted %d+%d",
		d.Kind, keysIn, len(reqs), duration.Round(time.Millisecond),
		kills[before], kills[inside], kills[committed], kills[stored], randomKills.Load(), victim.lives.Load(),
		flushed.Load(), outages.Load(), hedged.Load(), attempts-len(reqs)-int(hedged.Load()), counts.transport.Load(), counts.inProgress.Load(), counts.unavailable.Load(), counts.other.Load(),
		takenOver, recovered, reran, unstored, cut,
		doubleWrites, lost, notCommitted, wrongTransfer, counts.interrupted.Load(), orphans)
}

// send posts r, first to the victim when it is up (three times in four)
// and then to the survivor, until a 201 answers it. 409 in-progress and 503
// are retried, as a client following Retry-After would, only sooner.
func send(ctx context.Context, client *http.Client, r *transferRequest, victim, survivor *instance, counts *tally) {
	target := survivor
	if rand.IntN(4) > 0 && victim.up.Load() {
		target = victim
	}
	for ; r.attempts < 200; r.attempts++ {
		if ctx.Err() != nil {
			r.failure = "the trial's time ran out"
			return
		}
		if r.attempts > 0 {
			target = survivor
			time.Sleep(time.Duration(20+rand.IntN(30)) * time.Millisecond)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, target.url+"/transfers", strings.NewReader(r.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", r.key)
		resp, err := client.Do(req)
		if err != nil {
			counts.transport.Add(1)
			r.failure = err.Error()
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			counts.transport.Add(1)
			r.failure = err.Error()
			continue
		}
		problem := ""
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
			var p struct{ Type string }
			json.Unmarshal(body, &p)
			problem = strings.TrimPrefix(p.Type, idempotency.ProblemTypeBase)
		}
		switch {
		case resp.StatusCode == http.StatusCreated:
			r.attempts++
			r.answered, r.answer = true, string(body)
			return
		case resp.StatusCode == http.StatusConflict && problem == "in-progress":
			counts.inProgress.Add(1)
		case resp.StatusCode == http.StatusServiceUnavailable:
			counts.unavailable.Add(1)
		case problem == "interrupted":
			counts.interrupted.Add(1)
		default:
			counts.other.Add(1)
			r.attempts++
			r.failure = fmt.Sprintf("answered %d %s", resp.StatusCode, body)
			return // not an answer to retry: the trial fails on it
		}
		r.failure = fmt.Sprintf("answered %d %s", resp.StatusCode, body)
	}
}

// redisRecords counts the key-mode records left in state run without
// their lock, and those whose execution was taken over (n > 1).
func redisRecords(t *testing.T, rdb *redis.Client) (orphans, takenOver int) {
	ctx := t.Context()
	iter := rdb.Scan(ctx, 0, "*:r", 1000).Iterator()
	for iter.Next(ctx) {
		name := iter.Val()
		f, err := redistest.ReadRecord(ctx, rdb, name)
		if err != nil {
			t.Fatal(err)
		}
		if f.Executions != "" && f.Executions != "1" {
			takenOver++
		}
		if f.State == "run" {
			lock := strings.TrimSuffix(name, "r") + "l"
			if n, _ := rdb.Exists(ctx, lock).Result(); n == 0 {
				orphans++
			}
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return orphans, takenOver
}

// sqlRecords reads the keys table of NewSQL as redisRecords reads Redis:
// the records left in state run without a live lease (no holder, or its
// lease lapsed on the database's clock), and those whose execution was
// taken over. Expired records count as none, as the store reads them.
func sqlRecords(t *testing.T, d *sqltest.DB, table string) (orphans, takenOver int) {
	now := keyspace.SQLNow(d.Dialect)
	rows, err := d.QueryContext(t.Context(), "SELECT id, record, holder, "+
		"CASE WHEN holder_until > "+now+" THEN 1 ELSE 0 END FROM "+d.Dialect.Quote(table)+
		" WHERE record IS NOT NULL AND record_until > "+now)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id, holder string
			record     []byte
			leased     int
		)
		if err := rows.Scan(&id, &record, &holder, &leased); err != nil {
			t.Fatal(err)
		}
		f, ok := keyspace.ParseRecord(string(record))
		if !ok {
			t.Fatalf("%s: the keys table holds a record that does not parse: %q", id, record)
		}
		if f.Executions != "" && f.Executions != "1" {
			takenOver++
		}
		if f.State == "run" && (holder == "" || leased == 0) {
			orphans++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return orphans, takenOver
}

// killsShort is a KILL_AT that kills only at the points that died fewer
// than least times, each for one request in eight; "" when none did.
func killsShort(kills map[string]int, least int) string {
	var points []string
	for _, point := range []string{before, inside, committed, stored} {
		if kills[point] < least {
			points = append(points, point+"=0.125")
		}
	}
	return strings.Join(points, ",")
}

// killCounts reads the victim's kill log: one line per kill, its point.
func killCounts(t *testing.T, path string) map[string]int {
	out := map[string]int{}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return out
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		out[s.Text()]++
	}
	return out
}

// logCount counts the lines of the servers' logs that hold every one of
// parts.
func logCount(t *testing.T, paths []string, parts ...string) (n int) {
	for _, path := range paths {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
	lines:
		for line := range strings.Lines(string(raw)) {
			for _, p := range parts {
				if !strings.Contains(line, p) {
					continue lines
				}
			}
			n++
		}
	}
	return n
}

// logCounts counts the middleware's recoveries in the servers' logs.
func logCounts(t *testing.T, paths ...string) (recovered, reran int) {
	for _, path := range paths {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		recovered += strings.Count(string(raw), "recovered an abandoned execution's committed answer")
		reran += strings.Count(string(raw), "an abandoned execution committed nothing; running the handler again")
	}
	return recovered, reran
}
