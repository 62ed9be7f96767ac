package idempotency

// What a first execution pays for each of the middleware's guarantees is
// measured by turning that guarantee off in a benchmark build (go test
// -tags idemcost -bench FirstExecutionCost). In every other build costing
// is the constant false, so each check below compiles to nothing.
//
// A switch turns off a guarantee users rely on: none of them is an option.
type costSwitches struct {
	noWatchdog    bool // the lease is not renewed while the handler runs
	noFlights     bool // duplicates in this process do not wait for the leader
	noAdmission   bool // no admission to the background's bounds before the claim
	noExecTimeout bool // the run's context has no execution timeout
	noOutage      bool // no outage bookkeeping for the log and the observer
}

// cost is what a benchmark build turned off.
var cost costSwitches
