//go:build idemcost

package idempotency

// costing is true in a benchmark build: see costSwitches.
const costing = true
