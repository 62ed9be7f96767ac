package faultcheck_test

// An instance opens its database connections as it needs them, and on a
// machine busy with other work a new PostgreSQL connection (a backend
// forked, its start-up and authentication) can take longer than a
// history's store timeout: the first requests after an instance starts,
// or after the database restarted, then answer 503 with nothing between
// the instance and its database but the machine. The database's own
// probe (watchDatabase) commits on a connection it keeps, so it cannot see
// that. Each instance times its own dials instead, and reports one that
// took starvedAfter or more, which the rig marks as a slow window of that
// instance, as it marks one in which the process was not scheduled.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"time"

	"github.com/onceonly/idempotency/internal/sqltest"
)

// slowDialLine begins an instance's line of a dial that took starvedAfter
// or more: the dial's ends, in Unix nanoseconds.
const slowDialLine = "faultcheck instance slow dial "

// openTimed opens dsn with driverName as sql.Open does, with every new
// connection's dial timed and a slow one reported by slow.
func openTimed(driverName, dsn string, slow func(from, to time.Time)) (*sql.DB, error) {
	return sqltest.OpenWrapped(driverName, dsn, func(c driver.Connector) driver.Connector {
		return timedConnector{Connector: c, slow: slow}
	})
}

// A timedConnector is a driver's connector whose dials are timed.
type timedConnector struct {
	driver.Connector
	slow func(from, to time.Time)
}

func (c timedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	began := time.Now()
	conn, err := c.Connector.Connect(ctx)
	if took := time.Since(began); took >= starvedAfter {
		c.slow(began, began.Add(took))
	}
	return conn, err
}

// printSlowDial is an instance's report of a slow dial, for its rig.
func printSlowDial(from, to time.Time) {
	fmt.Printf("%s%d %d\n", slowDialLine, from.UnixNano(), to.UnixNano())
}

// markSlowDial puts a dial of instance i that took starvedAfter or more
// on the timeline.
func (r *rig) markSlowDial(i int, from, to time.Time) {
	r.markSlow(i, from, to, fmt.Sprintf("instance %s took %v to open a connection to the database (the machine is busy)",
		instanceName(i), to.Sub(from).Round(time.Millisecond)))
}
