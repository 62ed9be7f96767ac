package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/admin"
)

// resolve settles an interrupted key: -replay stores the answer SQL
// committed for it, -forget deletes its record. It refuses a key claimed
// less than -min-age ago, whose executor may still run (see claimAge),
// unless -force. It says what it is about to do and asks first, unless
// -yes.
func (s *session) resolve(ctx context.Context, stdin io.Reader, out io.Writer, key string, o options) error {
	st, err := s.inspect(ctx, key)
	if err != nil {
		return err
	}
	if !st.Interrupted {
		return fmt.Errorf("%s is not interrupted (%s); nothing changed", st.Key, stateOf(st))
	}
	claimed, err := s.claimAge(ctx, st)
	if err != nil {
		return err
	}
	if claimed < o.minAge && !o.force {
		return fmt.Errorf("%s was claimed %s, less than -min-age %s: its executor may still be running "+
			"(a lease lapses in a stall of %s or a pause, and the handler runs on until its execution timeout). "+
			"Wait, or pass -force if you know it stopped; nothing changed", st.Key, age(claimed), o.minAge, s.store())
	}
	found, err := s.lookup(ctx, st.Key)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s is interrupted: claimed %s, fence %d, %d execution(s), record TTL %s.\n",
		st.Key, age(claimed), st.Fence, st.Executions, duration(st.TTL))
	if claimed < o.minAge {
		fmt.Fprintf(out, "That is less than -min-age %s: settle it only if you know its executor stopped (-force).\n", o.minAge)
	}
	if o.replay {
		if !found.committed(st) {
			return fmt.Errorf("nothing to replay: SQL holds %s; nothing changed", found.describe(st))
		}
		a := found.row.Answer
		if a.NotReplayable {
			fmt.Fprintf(out, "SQL holds that it executed (status %d); its answer was too large to keep.\n"+
				"Settle it as executed, so that every retry is answered 409 not-replayable?\n", a.Status)
		} else {
			fmt.Fprintf(out, "SQL holds its committed answer: status %d, %d bytes.\n"+
				"Store that answer in %s, so that every retry is replayed it?\n", a.Status, len(a.Body), s.store())
		}
	} else {
		if found.committed(st) {
			fmt.Fprintf(out, "SQL holds its committed answer: resolve -replay would replay it. After -forget\n"+
				"the retry runs the handler, which replays it only if it commits through sqlidem.\n")
		}
		if tokenRecord(st.Key) {
			fmt.Fprintf(out, "Forget it? Its token stays spent: a retry is answered 422 token-not-found, and the form\n"+
				"asks for a new token, which runs the handler.\n")
		} else {
			fmt.Fprintf(out, "Delete its record, so that the next retry runs the handler again?\n")
		}
	}
	if !o.yes {
		fmt.Fprint(out, "Type yes to go on: ")
		if !confirmed(stdin) {
			return errors.New("not confirmed; nothing changed")
		}
	}

	step, cancel := s.step(ctx)
	defer cancel()
	if o.replay {
		err = s.ops.Resolve(step, st, found.row.Answer)
	} else {
		err = s.ops.Forget(step, st)
	}
	switch {
	case errors.Is(err, admin.ErrNotInterrupted), errors.Is(err, idempotency.ErrKeyReused):
		return fmt.Errorf("%w; nothing changed", err)
	case err != nil:
		return err
	case o.replay && found.row.Answer.NotReplayable:
		fmt.Fprintf(out, "Settled: %s now answers 409 not-replayable to every retry.\n", st.Key)
	case o.replay:
		fmt.Fprintf(out, "Replayed: %s now answers status %d to every retry.\n", st.Key, found.row.Answer.Status)
	case tokenRecord(st.Key):
		fmt.Fprintf(out, "Forgotten: %s; its token stays spent (a retry is answered 422 token-not-found).\n", st.Key)
	default:
		fmt.Fprintf(out, "Forgotten: %s has no record; the next retry runs the handler.\n", st.Key)
	}
	return nil
}

// confirmed reads one line and reports whether it is the word yes.
func confirmed(stdin io.Reader) bool {
	line, _ := bufio.NewReader(stdin).ReadString('\n')
	return strings.TrimSpace(line) == "yes"
}

// tokenRecord reports whether name is a token's record
// (PREFIX:{t…}:r:TOKEN): forgetting it leaves the token spent, and a
// retry is refused 422 token-not-found rather than run.
func tokenRecord(name string) bool {
	i := strings.LastIndex(name, "}:r:")
	if i < 0 {
		return false
	}
	j := strings.LastIndex(name[:i], "{")
	return j >= 0 && name[j+1] == 't'
}
