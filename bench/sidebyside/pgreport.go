package main

import (
	"fmt"
	"slices"
	"strings"
)

// markdown is the -store postgres section of docs/benchmarks.md.
func (rep *pgReport) markdown() string {
	var b strings.Builder
	idemlease := ""
	if il, ok := rep.Versions[idemleasePGKind.Name]; ok {
		idemlease = fmt.Sprintf("; idemlease %s with pgstore %s (pgx %s), built from an extracted tree of that release",
			il[idemleaseModule], il[idemleaseModule+"/pgstore"], il["github.com/jackc/pgx/v5"])
	}
	fmt.Fprintf(&b, "Measured %s on %s, %d cores shared by the servers, PostgreSQL and wrk; %s on loopback; %s, %s. "+
		"This library at %s (pgx %s)%s. Tables: %s.\n\n",
		rep.Date[:10], rep.Machine.CPU, rep.Machine.Cores, rep.PostgreSQL, rep.Go, rep.Wrk,
		rep.Library, rep.Versions["ours"]["github.com/jackc/pgx/v5"], idemlease, rep.tableNames())
	fmt.Fprintf(&b, "Load, per server and workload, in %d interleaved rounds, each server's on its emptied table: `%s` "+
		"(a warm-up, not measured), then `%s`, with [newkey.lua](../bench/sidebyside/newkey.lua) (first executions: "+
		"a new key per request) and [samekey.lua](../bench/sidebyside/samekey.lua) (duplicates: every connection "+
		"repeats one key, after one first call with it). req/s is the median of the rounds.\n\n",
		rep.Load.Rounds,
		strings.Replace(rep.Load.Warmup, "-s SCRIPT URL -- ARG", "-s SCRIPT", 1),
		strings.Replace(rep.Load.Measured, "-s SCRIPT URL -- ARG", "-s SCRIPT", 1))

	ratio := slices.ContainsFunc(kinds, func(k kind) bool { return k.Name == idemleasePGKind.Name })
	b.WriteString("| workload |" + kindColumns())
	if ratio {
		b.WriteString(" this library / idemlease |")
	}
	b.WriteString("\n| --- |" + strings.Repeat(" ---: |", len(kinds)+btoi(ratio)) + "\n")
	for _, w := range []string{"first", "duplicates"} {
		fmt.Fprintf(&b, "| %s |", workloadTitles[w])
		for _, k := range kinds {
			fmt.Fprintf(&b, " %s |", thousands(rep.median(k.Name, w).RPS))
		}
		if ratio {
			fmt.Fprintf(&b, " %.2f |", rep.median("ours", w).VsIdemlease)
		}
		b.WriteString("\n")
	}

	b.WriteString("\nPer request, medians of the rounds: CPU µs of the server's process (every thread, from /proc) and " +
		"of the PostgreSQL backends serving its connections (from /proc, found by application_name; PostgreSQL's " +
		"WAL writer, checkpointer and autovacuum are not in it), statements sent per answer (counted at the " +
		"server's driver over the measured run), and wrk's latency:\n\n")
	b.WriteString("| workload | of |" + kindColumns() + "\n| --- | --- |" + strings.Repeat(" ---: |", len(kinds)) + "\n")
	rows := []struct {
		what string
		of   func(pgMedian) string
	}{
		{"server process, CPU µs", func(m pgMedian) string { return fmt.Sprintf("%.0f", m.ServerCPU) }},
		{"PostgreSQL backends, CPU µs", func(m pgMedian) string { return fmt.Sprintf("%.0f", m.RedisCPU) }},
		{"server and backends, CPU µs", func(m pgMedian) string { return fmt.Sprintf("%.0f", m.ServerCPU+m.RedisCPU) }},
		{"wrk, CPU µs", func(m pgMedian) string { return fmt.Sprintf("%.0f", m.WrkCPU) }},
		{"statements per answer", func(m pgMedian) string { return trim(m.Statements) }},
		{"latency p50 / p99, ms", func(m pgMedian) string { return fmt.Sprintf("%.2f / %.2f", m.P50ms, m.P99ms) }},
	}
	for _, w := range []string{"first", "duplicates"} {
		for _, row := range rows {
			fmt.Fprintf(&b, "| %s | %s |", shortWorkloadTitles[w], row.what)
			for _, k := range kinds {
				fmt.Fprintf(&b, " %s |", row.of(rep.median(k.Name, w)))
			}
			b.WriteString("\n")
		}
	}

	requests := 0
	if len(rep.Counts) > 0 {
		requests = rep.Counts[0].Requests
	}
	fmt.Fprintf(&b, "\nStatements per request, counted at each server's database/sql driver (a query or an exec on "+
		"its own, a BEGIN, a COMMIT: each one round trip), over %d sequential requests per case, two instances "+
		"of each server on the same table:\n\n", requests)
	b.WriteString("| request |" + kindColumns() + "\n| --- |" + strings.Repeat(" --- |", len(kinds)) + "\n")
	for _, c := range countCases {
		fmt.Fprintf(&b, "| %s |", c.what)
		for _, k := range kinds {
			sc, ok := rep.count(k.Name, c.name)
			if !ok {
				b.WriteString(" — |")
				continue
			}
			fmt.Fprintf(&b, " %s |", verbs(sc))
		}
		b.WriteString("\n")
	}

	b.WriteString("\nEvery run: req/s, p50 latency, non-2xx answers (wrk's count), and whether every answer was as it " +
		"should be (the server's own count: 201s for first executions, 201 replays with no execution for duplicates; " +
		"an answer to a request that wrk cut off at the end of its run, written after the client had gone, is " +
		"counted apart):\n\n")
	b.WriteString("| round | workload |" + kindColumns() + "\n| ---: | --- |" + strings.Repeat(" --- |", len(kinds)) + "\n")
	for round := 1; round <= rep.Load.Rounds; round++ {
		for _, w := range []string{"first", "duplicates"} {
			fmt.Fprintf(&b, "| %d | %s |", round, w)
			for _, k := range kinds {
				for _, r := range rep.Runs {
					if r.Round == round && r.Server == k.Name && r.Workload == w {
						check := map[string]string{"first": "all 201", "duplicates": "all 201 replays"}[w]
						if r.Gone > 0 {
							check += fmt.Sprintf(" (and %d not, to requests wrk had cut off at its end)", r.Gone)
						}
						if !r.OK {
							check = "**" + r.Problem + "**"
						}
						fmt.Fprintf(&b, " %s, %.2f ms, %d non-2xx, %s |", thousands(r.RPS), r.P50ms, r.Non2xx, check)
					}
				}
			}
			b.WriteString("\n")
		}
	}

	b.WriteString("\nEach table after first executions sent to it 16 at a time (the trivial handler's answer: 201, " +
		"`Content-Type`, a body of about 45 bytes), as written, before any vacuum; bytes per row is " +
		"`pg_total_relation_size` (heap, indexes, TOAST) over the rows, the row itself the mean `pg_column_size`:\n\n")
	b.WriteString("| table | rows | heap | indexes | total | bytes per row | the row itself | dead rows reported | " +
		"bytes per row after `VACUUM FULL` |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, s := range rep.Sizes {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.0f | %.0f | %s | %.0f |\n", kindTitle(s.Server), thousands(float64(s.Rows)),
			kib(s.Heap), kib(s.Indexes), kib(s.Total), s.PerRow, s.RowBytes, thousands(float64(s.Dead)), s.CompactedPerRow)
	}

	b.WriteString("\nThis library's purge, on its table as above and then grown to ten times as many rows (copies of " +
		"them), each time right after `VACUUM ANALYZE` and with 1,000 of its rows made expired first; the statement " +
		"as the store sends it (its clock, `statement_timestamp()`, read once for the statement; the expiry checked " +
		"again outside the subquery; rows a claim holds skipped) and, beside it, the plain delete with the clock " +
		"bound; client-side time on loopback, median of 3:\n\n")
	b.WriteString("| rows in the table | statement | how PostgreSQL finds the rows | ms | rows deleted |\n" +
		"| ---: | --- | --- | ---: | ---: |\n")
	for _, p := range rep.Purges {
		what := "as sent (`record_until <= clock AND holder_until <= clock`, twice, `FOR UPDATE SKIP LOCKED`)"
		if strings.Contains(p.Statement, "$1") {
			what = "clock read once (`record_until <= $1 AND holder_until <= $1`)"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.1f | %s |\n", thousands(float64(p.Rows)), what, p.Plan, p.Millis,
			thousands(float64(p.Deleted)))
	}
	b.WriteString("\nRegenerate with `IDEMLEASE_DIR=… go run ./bench/sidebyside -store postgres -docs docs/benchmarks.md` " +
		"(POSTGRES_DSN names the PostgreSQL); the JSON is bench/sidebyside-postgres.json.\n")
	return b.String()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func kindTitle(name string) string {
	for _, k := range kinds {
		if k.Name == name {
			return k.Title
		}
	}
	return name
}

func (rep *pgReport) tableNames() string {
	var names []string
	for _, k := range kinds {
		names = append(names, k.Title+" `"+rep.Tables[k.Name]+"`")
	}
	return strings.Join(names, ", ") + " (dropped at the end)"
}

func (rep *pgReport) count(server, c string) (sqlCount, bool) {
	for _, sc := range rep.Counts {
		if sc.Server == server && sc.Case == c {
			return sc, true
		}
	}
	return sqlCount{}, false
}

// verbs is "7: BEGIN 1, INSERT 1, …" in the order a statement runs.
func verbs(sc sqlCount) string {
	order := []string{"SELECT", "BEGIN", "INSERT", "UPDATE", "DELETE", "COMMIT", "ROLLBACK"}
	var parts []string
	for _, v := range order {
		if n, ok := sc.ByVerb[v]; ok {
			parts = append(parts, v+" "+trim(n))
		}
	}
	for v, n := range sc.ByVerb {
		if !slices.Contains(order, v) {
			parts = append(parts, v+" "+trim(n))
		}
	}
	if len(parts) == 0 {
		return "0"
	}
	return trim(sc.Statements) + ": " + strings.Join(parts, ", ")
}

func kib(n int64) string { return thousands(float64(n)/1024) + " KiB" }
