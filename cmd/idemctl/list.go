package main

import (
	"context"
	"fmt"
	"io"

	"github.com/onceonly/idempotency/admin"
)

// listInterrupted prints the interrupted keys, one a line, named as the
// middleware logs them, and a count on errw, so that out holds nothing but
// keys and their figures. age is the claim's (see claimAge).
func (s *session) listInterrupted(ctx context.Context, out, errw io.Writer, limit int) error {
	n := 0
	for st, err := range s.ops.Interrupted(ctx) {
		if err != nil {
			return err
		}
		found, err := s.lookup(ctx, st.Key)
		if err != nil {
			return err
		}
		claimed, err := s.claimAge(ctx, st)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s  fence=%d  age=%s  executions=%d  ttl=%s%s\n",
			st.Key, st.Fence, since(claimed), st.Executions, duration(st.TTL), sqlColumn(st, found))
		if n++; n == limit {
			fmt.Fprintf(errw, "stopped after %d keys (-limit); there may be more\n", n)
			return nil
		}
	}
	fmt.Fprintf(errw, "%d interrupted key(s)\n", n)
	return nil
}

// sqlColumn says in a word what SQL holds for an interrupted key: answer
// (resolve -replay applies), other-answer (another request's), fenced or
// none. Empty without -db.
func sqlColumn(st admin.KeyState, found *sqlAnswer) string {
	switch {
	case found == nil:
		return ""
	case found.committed(st):
		return "  sql=answer"
	case found.found && found.row.Done:
		return "  sql=other-answer"
	case found.found:
		return "  sql=fenced"
	}
	return "  sql=none"
}
