package main

import (
	"fmt"
	"strings"
)

// A rung is one step from a cheaper design to a dearer one: what the
// dearer one adds, and so what its cost per first execution pays for.
type rung struct {
	from, to string
	adds     string
}

// ladder goes from the lease in the record (no separate lock) to the floor
// (bsm/redislock's lock with the claim riding behind it, a fence, a lease
// renewed by a timer) to this library (everything else it promises).
var ladder = []rung{
	{"lease", "floor", "bsm/redislock's lock (its obtain script, riding in one pipeline with the claim), " +
		"a fencing token from Redis's clock, a lease renewed while the handler runs"},
	{"floor", "ours", "waiting duplicates (in process and across instances: the waiters' flag), " +
		"the in-process answer cache, the drain's admission, the execution timeout, " +
		"recovery of abandoned and interrupted keys, the observer, every header replayed"},
}

// ladderSection says what each rung costs per first execution, from the
// medians of this run: the difference in CPU time of the server and of
// Redis, in Redis's time in scripts, in commands run, and in throughput.
func (rep *report) ladderSection(b *strings.Builder) {
	b.WriteString("\nWhat each step from the lease in record to this library costs per first execution, " +
		"from the medians above (CPU µs of the server process and of Redis, Redis's time in scripts, " +
		"commands run in Redis) and the throughput it keeps:\n\n")
	b.WriteString("| step | adds | server µs | Redis µs | script µs | commands | req/s kept |\n" +
		"| --- | --- | ---: | ---: | ---: | ---: | ---: |\n")
	title := map[string]string{}
	for _, k := range kinds {
		title[k.Name] = k.Title
	}
	for _, r := range ladder {
		from, to := rep.median(r.from, "first"), rep.median(r.to, "first")
		if from.RPS == 0 || to.RPS == 0 {
			continue
		}
		commands := "—"
		if f, ok1 := rep.count(r.from, "first"); ok1 {
			if t, ok2 := rep.count(r.to, "first"); ok2 {
				commands = fmt.Sprintf("%+.0f", t.Commands-f.Commands)
			}
		}
		fmt.Fprintf(b, "| %s → %s | %s | %+.0f | %+.0f | %+.0f | %s | %.2f |\n",
			title[r.from], title[r.to], r.adds,
			to.ServerCPU-from.ServerCPU, to.RedisCPU-from.RedisCPU, to.ScriptTime-from.ScriptTime,
			commands, to.RPS/from.RPS)
	}
}
