package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/onceonly/idempotency/admin"
	"github.com/onceonly/idempotency/sqlidem"
)

// show prints what the store, and with -db SQL, hold for key, and a verdict,
// which warns of an interrupted key claimed less than minAge ago.
func (s *session) show(ctx context.Context, out io.Writer, key string, minAge time.Duration) error {
	st, err := s.inspect(ctx, key)
	if err != nil {
		return err
	}
	found, err := s.lookup(ctx, st.Key)
	if err != nil {
		return err
	}
	var claimed time.Duration
	if st.State != "none" {
		if claimed, err = s.claimAge(ctx, st); err != nil {
			return err
		}
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	line := func(name, format string, args ...any) { fmt.Fprintf(tw, name+"\t"+format+"\n", args...) }
	line("key", "%s", st.Key)
	line("state", "%s", stateOf(st))
	if st.State != "none" {
		line("claimed", "%s, by %s", age(claimed), s.clockName())
		line("fingerprint", "%s", st.Fingerprint)
		line("fence", "%d", st.Fence)
		line("executions", "%d", st.Executions)
		if st.State == "done" {
			line("answer", "status %d, %d bytes", st.Status, st.BodySize)
		}
		line("record TTL", "%s", duration(st.TTL))
	}
	line("lock", "%s", lockOf(st))
	line("waiting", "%s", map[bool]string{true: "another instance waits for the lock", false: "no"}[st.Waiting])
	if found != nil {
		line("SQL", "%s", found.describe(st))
	}
	line("verdict", "%s", verdict(st, found, claimed, minAge))
	return tw.Flush()
}

func (s *session) inspect(ctx context.Context, key string) (admin.KeyState, error) {
	step, cancel := s.step(ctx)
	defer cancel()
	return s.ops.Inspect(step, key)
}

// sqlAnswer is what the outcome table holds for a key.
type sqlAnswer struct {
	found bool
	row   sqlidem.Row
}

// lookup reads the row of key (KeyState.Key, Execution.Key) from the
// outcome table; nil without -db.
func (s *session) lookup(ctx context.Context, key string) (*sqlAnswer, error) {
	if s.outcomes == nil {
		return nil, nil
	}
	step, cancel := s.step(ctx)
	defer cancel()
	row, found, err := s.outcomes.Lookup(step, key)
	if err != nil {
		return nil, fmt.Errorf("SQL: %w", err)
	}
	return &sqlAnswer{found: found, row: row}, nil
}

// committed reports whether SQL holds an answer for the request that
// claimed st, the one resolve -replay would store.
func (a *sqlAnswer) committed(st admin.KeyState) bool {
	return a != nil && a.found && a.row.Done && a.row.Answer.Fingerprint == st.Fingerprint
}

func (a *sqlAnswer) describe(st admin.KeyState) string {
	switch {
	case !a.found:
		return "no row for this key"
	case !a.row.Done:
		return fmt.Sprintf("no answer; fenced at %d (recovery found nothing committed)", a.row.Fence)
	}
	whose := "the claiming request's"
	if !a.committed(st) {
		whose = "ANOTHER request's (fingerprint " + a.row.Answer.Fingerprint + ")"
	}
	if a.row.Answer.NotReplayable {
		return fmt.Sprintf("executed, status %d, its answer too large to keep (not replayable), fence %d, %s",
			a.row.Answer.Status, a.row.Fence, whose)
	}
	return fmt.Sprintf("committed answer, status %d, %d bytes, fence %d, %s",
		a.row.Answer.Status, len(a.row.Answer.Body), a.row.Fence, whose)
}

func stateOf(st admin.KeyState) string {
	switch {
	case st.Interrupted:
		return "run, interrupted: nobody holds the lock it was claimed with"
	case st.State == "run" && st.Lock == st.Owner:
		return "run: its executor holds the lock"
	case st.State == "run":
		return "run: its lock lapsed, and its executor may still store its answer"
	case st.State == "big":
		return "big: executed, its answer was not replayable"
	case st.State == "none":
		return "none: no record"
	case st.State == "corrupt":
		return "corrupt: a record this version cannot read"
	}
	return st.State
}

func lockOf(st admin.KeyState) string {
	switch st.Lock {
	case "":
		return "free"
	case st.Owner:
		return "held by its executor, " + duration(st.LockTTL) + " left"
	}
	return "held by another request, " + duration(st.LockTTL) + " left"
}

// duration rounds a TTL for people.
func duration(d time.Duration) string {
	switch {
	case d < 0:
		return "none (never expires)"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
