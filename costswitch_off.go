//go:build !idemcost

package idempotency

// costing is false outside benchmark builds: see costSwitches.
const costing = false
