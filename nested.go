package idempotency

// Protection nests. A route may be protected twice: a group's layer and
// the route's own (chi's r.Use plus r.With), or two Middlewares.
//
//   - The same Middleware inside its own execution steps aside: the outer
//     layer protects the request already, and the inner one, claiming the
//     key again, could only wait for its own claim and answer in-progress,
//     which the outer layer would store as the key's answer.
//   - A different Middleware that names the same record (the same Redis
//     key prefix and key) steps aside for the same reason.
//   - A different Middleware with a record of its own protects
//     independently, inside the outer execution: its answers, refusals
//     included, are the outer handler's answer, stored and replayed by the
//     outer layer like any other.
//
// A layer that steps aside runs the handler as given (Outcome Unprotected).

// outerExecution is the execution of a handler that r's context runs
// inside, or nil.
func (c *call) outerExecution() *execution {
	x, _ := c.ctx.Value(executionKey).(*execution)
	return x
}

// nestedInSelf reports whether the call runs inside an execution of m.
func (m *Middleware) nestedInSelf(c *call) bool {
	x := c.outerExecution()
	return x != nil && x.owner == m
}

// nestedOnSameRecord reports whether the identified call runs inside an
// execution, of another Middleware, of the record it would claim.
func (m *Middleware) nestedOnSameRecord(c *call) bool {
	x := c.outerExecution()
	return x != nil && x.key == m.redisKeys(c).record
}
