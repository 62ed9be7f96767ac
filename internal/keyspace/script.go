package keyspace

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/record.lua
var recordSource string

// RecordScript is a script that reads or writes keys' records: body, with
// the layout's one definition (lua/record.lua) in front. One prelude
// built into each script, rather than a Redis function library: a script
// goes by its digest and, where Redis lacks it (restarted without
// persistence, or its scripts flushed), whole, so a missing script never
// fails a request; a library would have to be loaded onto every server
// and every Cluster master before any request could run, and again after
// each restart. It also runs on every Redis and Valkey the middleware
// supports, functions or not.
func RecordScript(body string) *redis.Script { return redis.NewScript(recordSource + body) }
