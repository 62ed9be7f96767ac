package main

import (
	"context"
	"fmt"
	"time"

	"github.com/onceonly/idempotency/admin"
	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/redis/go-redis/v9"
)

// claimAge is how long ago st's latest claim was made. An interrupted key
// is one whose lock no longer holds its claim's value, which is also true
// of an executor still running after its lease lapsed (a stall of the
// store, a paused process) until its execution timeout ends it: the age
// tells the two apart. The fence is the claiming server's TIME (in SQL,
// the database's clock) in microseconds, so the age is read on that
// server's clock, not on ours.
func (s *session) claimAge(ctx context.Context, st admin.KeyState) (time.Duration, error) {
	offset, err := s.clock(ctx, st.Key)
	if err != nil {
		return 0, err
	}
	return time.Now().Add(offset).Sub(time.UnixMicro(int64(st.Fence))), nil
}

// clock returns how far ahead of ours is the clock of the Redis that holds
// record (its master, on a Cluster), or of -store's database, asked once
// per server.
func (s *session) clock(ctx context.Context, record string) (time.Duration, error) {
	if s.keys != nil {
		return s.databaseClock(ctx)
	}
	node := s.rdb
	if c, ok := s.rdb.(*redis.ClusterClient); ok {
		step, cancel := s.step(ctx)
		master, err := c.MasterForKey(step, record)
		cancel()
		if err != nil {
			return 0, err
		}
		node = master
	}
	addr := ""
	if c, ok := node.(*redis.Client); ok {
		addr = c.Options().Addr
	}
	if offset, ok := s.clocks[addr]; ok {
		return offset, nil
	}
	step, cancel := s.step(ctx)
	defer cancel()
	before := time.Now()
	now, err := node.Time(step).Result()
	if err != nil {
		return 0, err
	}
	// Redis read its clock about halfway through the round trip.
	offset := now.Sub(before) - time.Since(before)/2
	s.clocks[addr] = offset
	return offset, nil
}

// databaseClock is clock for -store's database, read as the store reads
// it (keyspace.SQLNow).
func (s *session) databaseClock(ctx context.Context) (time.Duration, error) {
	if offset, ok := s.clocks[""]; ok {
		return offset, nil
	}
	step, cancel := s.step(ctx)
	defer cancel()
	before := time.Now()
	var micros int64
	if err := s.keys.QueryRowContext(step, "SELECT "+keyspace.SQLNow(s.dialect)).Scan(&micros); err != nil {
		return 0, fmt.Errorf("reading the database's clock: %w", err)
	}
	offset := time.UnixMicro(micros).Sub(before) - time.Since(before)/2
	s.clocks[""] = offset
	return offset, nil
}

// age prints a claim's age for people; a negative one (a clock that went
// back, a failover to a server behind) is said as such.
func age(d time.Duration) string {
	if d < 0 {
		return "in the future by " + duration(-d) + " (a clock went back)"
	}
	return duration(d) + " ago"
}

// since prints a claim's age in a column: negative when a clock went back.
func since(d time.Duration) string {
	if d < 0 {
		return "-" + duration(-d)
	}
	return duration(d)
}
