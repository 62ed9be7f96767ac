//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/example/internal/bank"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
	"github.com/redis/go-redis/v9"
)

// The stale-executor trial: server A is stopped with SIGSTOP in the middle
// of a transfer, keeping its connections, its transaction and its locks
// but renewing no lease; the same request goes to server B, which takes
// the key over with a higher fencing token once A's lease has run out;
// then A gets SIGCONT and carries on as if nothing had happened, as after
// a long GC pause or a frozen VM. sqlidem's unit tests stage the takeover
// by calling Recover; here two processes meet as they would in production.
//
// What each database allows, and this trial checks:
//
//   - PostgreSQL and MariaDB: B's recovery fences the key while A sleeps,
//     so A's outcome row cannot go in and its writes roll back. Stopped
//     inside its transaction, A still holds its row locks, so B's transfer
//     waits for A to end before it commits. B's answer is the one answer;
//     A's client gets 409 in-progress, or B's answer replayed.
//   - SQLite: A stopped inside its transaction holds the database's only
//     write lock, so B can neither fence nor commit until A ends. A, once
//     continued, either commits first (its lease is lost, but it has not
//     heard so yet): B then replays A's answer; or it hears of the lost
//     lease first and commits nothing: B then runs the transfer. Either
//     way the money moves once and both clients get the committed answer,
//     or A's client a refusal to retry.
//   - Stopped before its transaction, A holds nothing on any database: B
//     fences and commits while A sleeps, and A, continued, finds B's answer
//     or B's fence.

func TestStaleExecutorPausedBySIGSTOP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a server and stops it with SIGSTOP")
	}
	bin := buildServer(t, t.TempDir())
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		for _, point := range []string{inside, before} {
			t.Run(point, func(t *testing.T) { staleTrial(t, bin, d, point) })
		}
	})
}

// A reply is what one client finally got.
type reply struct {
	status   int
	problem  string // the problem type's slug, for problem+json
	replayed bool   // Idempotent-Replayed: true
	body     string
	err      error
	attempts int
}

func (r reply) String() string {
	if r.err != nil {
		return fmt.Sprintf("error %v after %d attempts", r.err, r.attempts)
	}
	return fmt.Sprintf("%d %s replayed=%v after %d attempts: %s",
		r.status, r.problem, r.replayed, r.attempts, strings.TrimSpace(r.body))
}

// kind names what the client got, for comparing with what a case allows.
func (r reply) kind(committed string) string {
	switch {
	case r.err != nil:
		return "no answer"
	case r.status == http.StatusCreated && r.body != committed:
		return "201 of an uncommitted answer"
	case r.status == http.StatusCreated && r.replayed:
		return "committed answer replayed"
	case r.status == http.StatusCreated:
		return "committed answer"
	}
	return fmt.Sprintf("%d %s", r.status, r.problem)
}

// refusedToRetry: the answer of an execution that committed nothing and
// tells the client to try again.
func (r reply) refusedToRetry() bool {
	return r.err == nil && (r.status == http.StatusConflict && r.problem == "in-progress" ||
		r.status == http.StatusServiceUnavailable)
}

func staleTrial(t *testing.T, bin string, d *sqltest.DB, point string) {
	ctx := t.Context()
	const amount = 2500
	seed := map[string]int64{"alice": 100_000, "bob": 100_000}
	b, prefix, env := openBank(t, d, seed)
	rs := redistest.Private(t)
	rdb := rs.Client(t)
	env = append(env, "REDIS_URL=redis://"+rs.Addr(), "LOCK_LEASE=400ms")

	a := newInstance(t, bin, "a", append(env, "PAUSE_AT="+point)...)
	// Runs before a's stop: a process killed while stopped dies all the
	// same, but one continued first ends as any other.
	t.Cleanup(func() { a.signal(syscall.SIGCONT) })
	bi := newInstance(t, bin, "b", env...)
	a.keepAlive(t)
	bi.keepAlive(t)
	defer func() {
		if t.Failed() || testing.Verbose() {
			logServers(t, a, bi)
		}
	}()

	const key = "stale-1"
	body := fmt.Sprintf(`{"from":"alice","to":"bob","amount":%d}`, amount)
	client := &http.Client{Timeout: 30 * time.Second}
	fromA, fromB := make(chan reply, 1), make(chan reply, 1)
	go func() { fromA <- post(ctx, client, a.url, key, body, true) }()

	// A stops at the point, its key claimed.
	if err := waitFor(15*time.Second, func() bool { return procState(a.pid()) == 'T' }); err != nil {
		t.Fatalf("A never stopped at %s: %v", point, err)
	}
	rec := readRecord(t, rdb)
	if rec.state != "run" || rec.runs != 1 {
		t.Fatalf("A stopped with the record %+v; want one run", rec)
	}
	aFence := rec.fence
	// A renews nothing now: its lock runs out within a lease.
	if err := waitFor(5*time.Second, func() bool { return rdb.Exists(ctx, rec.lock).Val() == 0 }); err != nil {
		t.Fatalf("A's lock outlived its lease while A was stopped: %v", err)
	}

	go func() { fromB <- postUntilAnswered(ctx, client, bi.url, key, body) }()
	if err := waitFor(10*time.Second, func() bool { return readRecord(t, rdb).runs == 2 }); err != nil {
		t.Fatalf("B never took the key over: %v", err)
	}
	rec = readRecord(t, rdb)
	bFence := rec.fence
	if bFence <= aFence {
		t.Fatalf("B took over with fence %d, not above A's %d", bFence, aFence)
	}
	t.Logf("A stopped at %s with fence %d; B took the key %s over with fence %d", point, aFence, rec.name, bFence)

	outcomes := b.Outcomes()
	var bEarly *reply
	switch {
	case point == before:
		// A holds nothing: B fences, runs and commits while A sleeps.
		select {
		case r := <-fromB:
			bEarly = &r
		case <-time.After(15 * time.Second):
			t.Fatal("B did not answer while A, stopped before its transaction, held nothing")
		}
	case d.Kind != sqltest.SQLite:
		// B fences the key beside A's open transaction, then its transfer
		// waits for A's row locks.
		err := waitFor(10*time.Second, func() bool {
			row, ok, err := outcomes.Lookup(ctx, rec.name)
			return err == nil && ok && !row.Done && row.Fence == bFence
		})
		if err != nil {
			t.Fatalf("B's fence row never appeared beside A's open transaction: %v", err)
		}
		time.Sleep(300 * time.Millisecond) // B's transfer reaches A's locks
	default:
		// B's recovery waits for the write lock A holds; nothing shows it.
		time.Sleep(500 * time.Millisecond)
	}
	if point == inside {
		select {
		case r := <-fromB:
			t.Fatalf("B answered while A held its transaction open: %v", r)
		default:
		}
	}

	if !a.signal(syscall.SIGCONT) {
		t.Fatal("A is gone before its SIGCONT")
	}
	var ra, rb reply
	haveA, haveB := false, bEarly != nil
	if haveB {
		rb = *bEarly
	}
	for timeout := time.After(20 * time.Second); !haveA || !haveB; {
		select {
		case ra = <-fromA:
			haveA = true
		case rb = <-fromB:
			haveB = true
		case <-timeout:
			t.Fatalf("within 20s of A's SIGCONT, A answered %v and B %v", haveA, haveB)
		}
	}
	t.Logf("A's client: %v", ra)
	t.Logf("B's client: %v", rb)

	// The database: the money moved once, under one committed answer.
	row, ok, err := outcomes.Lookup(ctx, rec.name)
	if err != nil || !ok || !row.Done {
		t.Fatalf("the key's outcome row: %+v, found %v, error %v; want a committed answer", row, ok, err)
	}
	t.Logf("the committed answer's fence: %d (A %d, B %d)", row.Fence, aFence, bFence)
	var rows int
	if err := d.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+prefix+sqlidem.DefaultTable).Scan(&rows); err != nil || rows != 1 {
		t.Errorf("the outcome table holds %d rows (error %v); want the key's only", rows, err)
	}
	checkMovedOnce(t, b, seed, amount, string(row.Answer.Body))

	committed := string(row.Answer.Body)
	// What A's client may get. A hears of its lost lease when its
	// watchdog's first renewal after SIGCONT fails, racing its own next
	// step: a step the lost lease cancels, or an outcome row refused for
	// B's fence, answers 409 in-progress (nothing of A's committed); B's
	// answer found committed is replayed.
	var wantA []string
	wantB := "committed answer"
	switch {
	case row.Fence == aFence && d.Kind == sqltest.SQLite && point == inside:
		// A went on to commit before it heard: B could not fence while
		// A held SQLite's write lock, and finds A's answer when it can.
		wantA, wantB = []string{"committed answer"}, "committed answer replayed"
	case row.Fence != bFence:
		t.Fatalf("the answer committed with fence %d, not B's %d, on %s with A stopped %s: "+
			"docs/outcomes.md says a stale executor cannot commit", row.Fence, bFence, d.Kind, point)
	case point == before:
		// B committed while A slept holding nothing: A's first read finds
		// B's answer, unless the lost lease cancels its BEGIN or the read.
		wantA = []string{"committed answer replayed", "409 in-progress"}
	case d.Kind == sqltest.SQLite:
		// Cancelled first, A rolls back and reads the key again: nothing
		// yet or B's fence (in-progress), or B's answer once B got the
		// write lock.
		wantA = []string{"409 in-progress", "committed answer replayed"}
	default:
		// B's fence row committed before SIGCONT: A's row cannot go in,
		// cancelled or not, and reading again finds B's fence, or B's
		// answer once B's transfer, freed from A's row locks, commits.
		wantA = []string{"409 in-progress", "committed answer replayed"}
	}
	committer := map[uint64]string{aFence: "A", bFence: "B"}[row.Fence]
	t.Logf("outcome: %s/%s: committed by %s; A's client: %s; B's client: %s",
		d.Kind, point, committer, ra.kind(committed), rb.kind(committed))
	if got := rb.kind(committed); got != wantB {
		t.Errorf("B's client got %v (%s); want the %s", rb, got, wantB)
	}
	if got := ra.kind(committed); !slices.Contains(wantA, got) {
		t.Errorf("A's client got %v (%s); want one of %q", ra, got, wantA)
	}

	// Redis: B's record, done.
	if rec := readRecord(t, rdb); rec.state != "done" || rec.runs != 2 {
		t.Errorf("the key's record ends as %+v; want done after two runs", rec)
	}
	for _, in := range []*instance{a, bi} {
		if lives := in.lives.Load(); lives != 1 {
			t.Errorf("%s had %d lives; it is never killed", filepath.Base(in.logs.Name()), lives)
		}
	}
}

// checkMovedOnce checks that the database holds exactly one transfer,
// the one the committed answer names, and the balances it leaves.
func checkMovedOnce(t *testing.T, b *bank.Bank, seed map[string]int64, amount int64, committed string) {
	t.Helper()
	ctx := t.Context()
	var receipt bank.Receipt
	if err := json.Unmarshal([]byte(committed), &receipt); err != nil {
		t.Fatalf("the committed answer %q is no receipt: %v", committed, err)
	}
	_, transfers := b.Tables()
	rows, err := b.DB().QueryContext(ctx, "SELECT id, from_account, to_account, amount FROM "+transfers)
	if err != nil {
		t.Fatal(err)
	}
	var got []bank.Transfer
	for rows.Next() {
		var tr bank.Transfer
		if err := rows.Scan(&tr.ID, &tr.From, &tr.To, &tr.Amount); err != nil {
			t.Fatal(err)
		}
		got = append(got, tr)
	}
	rows.Close()
	want := bank.Transfer{ID: receipt.Transfer.ID, From: "alice", To: "bob", Amount: amount}
	if len(got) != 1 || got[0] != want {
		t.Errorf("the transfers table holds %+v; want only %+v, the committed answer's", got, want)
	}
	accounts, err := b.Accounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, acct := range accounts {
		want := seed[acct.ID]
		switch acct.ID {
		case "alice":
			want -= amount
		case "bob":
			want += amount
		}
		if acct.Balance != want || receipt.Balances[acct.ID] != want {
			t.Errorf("%s holds %d, and the receipt says %d; one transfer leaves %d",
				acct.ID, acct.Balance, receipt.Balances[acct.ID], want)
		}
	}
}

// post sends the transfer once; pause asks a server with PAUSE_AT to stop.
func post(ctx context.Context, client *http.Client, url, key, body string, pause bool) reply {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/transfers", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	if pause {
		req.Header.Set(pauseHeader, "1")
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{err: err, attempts: 1}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, replayed: resp.Header.Get(idempotency.ReplayedHeader) == "true",
		body: string(raw), err: err, attempts: 1}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		var p struct{ Type string }
		json.Unmarshal(raw, &p)
		r.problem = strings.TrimPrefix(p.Type, idempotency.ProblemTypeBase)
	}
	return r
}

// postUntilAnswered sends the transfer again while the server says to
// retry, as the trials' clients do.
func postUntilAnswered(ctx context.Context, client *http.Client, url, key, body string) reply {
	for attempts := 1; ; attempts++ {
		r := post(ctx, client, url, key, body, false)
		r.attempts = attempts
		if !r.refusedToRetry() || ctx.Err() != nil || attempts == 400 {
			return r
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitFor polls cond until it holds, for at most within.
func waitFor(within time.Duration, cond func() bool) error {
	for deadline := time.Now().Add(within); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", within)
		}
	}
	return nil
}

// procState is the state letter of /proc/PID/stat ('T': stopped), or 0.
func procState(pid int) byte {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil || pid == 0 {
		return 0
	}
	// pid (comm) state …: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 || i+2 >= len(raw) {
		return 0
	}
	return raw[i+2]
}

// pid is the running life's process id, or 0.
func (in *instance) pid() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.proc == nil {
		return 0
	}
	return in.proc.Pid
}

// signal sends sig to the running life, reporting whether one was there.
func (in *instance) signal(sig syscall.Signal) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.proc != nil && in.proc.Signal(sig) == nil
}

// A redisRecord is the one key-mode record of a trial's private Redis.
type redisRecord struct {
	name, lock string // name is also Execution.Key, the outcome row's key
	state      string
	runs       int    // executions: 2 once taken over
	fence      uint64 // the fencing token of the latest
}

func readRecord(t *testing.T, rdb *redis.Client) redisRecord {
	ctx := t.Context()
	names, err := rdb.Keys(ctx, "*:r").Result()
	if err != nil || len(names) != 1 {
		t.Fatalf("Redis holds the records %q (error %v); want one", names, err)
	}
	f, err := redistest.ReadRecord(ctx, rdb, names[0])
	if err != nil {
		t.Fatal(err)
	}
	rec := redisRecord{name: names[0], lock: strings.TrimSuffix(names[0], "r") + "l"}
	rec.state = f.State
	rec.runs, _ = strconv.Atoi(f.Executions)
	rec.fence, _ = strconv.ParseUint(f.Fence, 10, 64)
	return rec
}

// logServers logs what the servers logged, for the record of what happened.
func logServers(t *testing.T, ins ...*instance) {
	for _, in := range ins {
		raw, _ := os.ReadFile(in.logs.Name())
		for line := range strings.Lines(string(raw)) {
			t.Logf("%s: %s", filepath.Base(in.logs.Name()), strings.TrimSpace(line))
		}
	}
}
