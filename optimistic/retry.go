package optimistic

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Policy bounds Retry. The zero Policy means the defaults; a field left at
// zero (or below) takes its default alone.
type Policy struct {
	// Attempts is how many times fn runs at most, the first run included.
	// Default 10.
	Attempts int
	// Base is the back-off ceiling before the second run; it doubles for
	// every later one. Default 2 ms.
	Base time.Duration
	// Cap bounds the back-off ceiling. Default 200 ms.
	Cap time.Duration
}

func (p Policy) withDefaults() Policy {
	if p.Attempts <= 0 {
		p.Attempts = 10
	}
	if p.Base <= 0 {
		p.Base = 2 * time.Millisecond
	}
	if p.Cap <= 0 {
		p.Cap = 200 * time.Millisecond
	}
	return p
}

// backoff is the pause before run n+1 (n ≥ 1 runs done): "full jitter",
// uniform between 0 and min(Cap, Base·2^(n-1)). Drawing from the whole
// range rather than around the ceiling is what spreads writers that
// collided apart, so they do not collide again in lockstep.
func (p Policy) backoff(n int) time.Duration {
	ceiling := p.Cap
	if shift := n - 1; shift < 62 {
		if d := p.Base << shift; d > 0 && d < ceiling {
			ceiling = d
		}
	}
	return rand.N(ceiling + 1)
}

// Retry runs fn until it returns an error that does not match ErrConflict
// (nil included), or a conflict that only a new transaction can get past
// (ConflictError.Snapshot), and returns that. fn must re-read what it writes on every
// run: a conflict means its last read is out of date. A row or hash that
// vanished is a conflict too; fn's next read finds it gone and returns its
// own error, which ends the loop.
//
// Between runs Retry sleeps with exponential back-off and full jitter (see
// Policy). When the attempts run out it returns the last conflict, wrapped,
// so errors.Is(err, ErrConflict) and errors.As still see it. When ctx ends
// first, it returns at once with ctx's error (and its cause, if
// context.WithCancelCause set one) joined to the last conflict, if any; fn
// does not run on a context that has already ended.
func Retry(ctx context.Context, p Policy, fn func(context.Context) error) error {
	p = p.withDefaults()
	var last error
	for n := range p.Attempts {
		if n > 0 {
			timer := time.NewTimer(p.backoff(n))
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
			}
		}
		if ctx.Err() != nil {
			return stopped(ctx, last)
		}
		err := fn(ctx)
		var conflict *ConflictError
		if !errors.Is(err, ErrConflict) || errors.As(err, &conflict) && conflict.Snapshot {
			return err // a stale snapshot: only a new transaction reads past it
		}
		last = err
	}
	return fmt.Errorf("optimistic: gave up after %d attempts: %w", p.Attempts, last)
}

// stopped is Retry's error when ctx ended: the context's error first, since
// that is why Retry stopped, then the conflict that made it wait.
func stopped(ctx context.Context, last error) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		err = fmt.Errorf("%w: %w", err, cause)
	}
	if last == nil {
		return err
	}
	return errors.Join(err, last)
}
