package sqlidem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"

	"github.com/onceonly/idempotency"
)

// A RunOption configures Run.
type RunOption func(*runConfig)

type runConfig struct{ codec idempotency.Codec }

// RunCodec encodes Run's result for its row. It must be the codec the
// idempotency.Do around Run uses (idempotency.UseCodec), since Do decodes
// a recovered answer with it. Default idempotency.JSON, Do's default.
func RunCodec(c idempotency.Codec) RunOption { return func(rc *runConfig) { rc.codec = c } }

// Run is Handler for a function protected by idempotency.Do: call it
// inside the function given to Do, with Do's context. It runs fn in a
// transaction and commits fn's result in the same transaction, in a row
// keyed by Do's key:
//
//	receipt, err := idempotency.Do(ctx, durable, key, func(ctx context.Context) (Receipt, error) {
//		return sqlidem.Run(ctx, outcomes, func(ctx context.Context, tx *sql.Tx) (Receipt, error) {
//			return charge(ctx, tx, msg)
//		})
//	})
//
// A result committed already is returned without running fn; a result
// committed for different input under the key is refused as
// idempotency.ErrKeyReused. When fn fails, or the commit does, nothing
// commits, the key is released (idempotency.Release) even under
// idempotency.StoreErrors, and the error is returned. A stale execution,
// fenced out by a newer one, gets idempotency.ErrInProgress.
//
// Outside Do (no protected execution in ctx), fn runs in a transaction
// with no outcome row.
func Run[T any](ctx context.Context, s *Store, fn func(ctx context.Context, tx *sql.Tx) (T, error), opts ...RunOption) (T, error) {
	cfg := runConfig{codec: idempotency.JSON}
	for _, o := range opts {
		o(&cfg)
	}
	var zero T
	exec, protected := idempotency.ExecutionOf(ctx)
	if !protected {
		return runUnprotected(ctx, s, fn)
	}
	var result T
	o := s.commitOnce(ctx, exec, func(tx *sql.Tx) (idempotency.Answer, error) {
		v, err := fn(ctx, tx)
		if err != nil {
			return idempotency.Answer{}, err
		}
		body, err := cfg.codec.Marshal(v)
		if err != nil {
			return idempotency.Answer{}, fmt.Errorf("sqlidem: encoding the result: %w", err)
		}
		result = v
		// The status Do stores a result under, so that a recovered row
		// reads as Do's own.
		return idempotency.Answer{Status: http.StatusOK, Body: body}, nil
	})
	switch o.verdict {
	case committed:
		return result, nil
	case replayed:
		if o.answer.Status != http.StatusOK {
			return zero, errors.Join(idempotency.ErrUnreadableRecord,
				fmt.Errorf("sqlidem: committed status %d is not a function's result", o.answer.Status))
		}
		var v T
		if err := cfg.codec.Unmarshal(o.answer.Body, &v); err != nil {
			return zero, errors.Join(idempotency.ErrUnreadableRecord, err)
		}
		return v, nil
	}
	idempotency.Release(ctx)
	return zero, o.err
}

func runUnprotected[T any](ctx context.Context, s *Store, fn func(ctx context.Context, tx *sql.Tx) (T, error)) (T, error) {
	var zero T
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return zero, unavailable(err)
	}
	defer tx.Rollback()
	v, err := fn(ctx, tx)
	if err != nil {
		return zero, err
	}
	if err := tx.Commit(); err != nil {
		return zero, unavailable(err)
	}
	return v, nil
}
