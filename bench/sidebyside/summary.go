package main

import (
	"fmt"
	"strings"
)

// The README's short version of the run sits between these markers.
const (
	summaryBegin = "<!-- sidebyside-summary:begin -->"
	summaryEnd   = "<!-- sidebyside-summary:end -->"
)

// summary is the README's table: throughput and cost per request of each
// server, from the same run as the full section of docs/benchmarks.md.
func (rep *report) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s on %s (%d cores shared by the server, Redis and wrk), %s, "+
		"`%s` per server and workload, medians of %d interleaved rounds, this library at %s:\n\n",
		rep.Date[:10], rep.Machine.CPU, rep.Machine.Cores, rep.Redis, wrkLoad(rep.Load.Measured),
		rep.Load.Rounds, rep.Library)
	b.WriteString("| per request |" + kindColumns() + "\n| --- |" + strings.Repeat(" ---: |", len(kinds)) + "\n")
	row := func(what string, cell func(k kind) string) {
		fmt.Fprintf(&b, "| %s |", what)
		for _, k := range kinds {
			b.WriteString(" " + cell(k) + " |")
		}
		b.WriteString("\n")
	}
	for _, w := range []string{"first", "duplicates"} {
		row(shortWorkloadTitles[w]+", req/s", func(k kind) string {
			m := rep.median(k.Name, w)
			if k.Name == "fiber" || k.Name == "lease" || k.Name == "idemlease" || m.VsFiber == 0 {
				return thousands(m.RPS)
			}
			switch {
			case m.VsIdemlease > 0:
				return fmt.Sprintf("%s (%.2f× idemlease, %.2f× Fiber)", thousands(m.RPS), m.VsIdemlease, m.VsFiber)
			case m.VsLease > 0:
				return fmt.Sprintf("%s (%.2f× lease, %.2f× Fiber)", thousands(m.RPS), m.VsLease, m.VsFiber)
			}
			return fmt.Sprintf("%s (%.2f× Fiber)", thousands(m.RPS), m.VsFiber)
		})
	}
	row("first execution, CPU µs: server + Redis", func(k kind) string {
		m := rep.median(k.Name, "first")
		if !k.UsesRedis {
			return fmt.Sprintf("%.0f", m.ServerCPU)
		}
		return fmt.Sprintf("%.0f + %.0f", m.ServerCPU, m.RedisCPU)
	})
	row("Redis round trips: first / duplicate elsewhere", func(k kind) string {
		first, ok1 := rep.count(k.Name, "first")
		other, ok2 := rep.count(k.Name, "dup-other")
		if !k.UsesRedis || !ok1 || !ok2 {
			return "—"
		}
		return trim(first.RoundTrips) + " / " + trim(other.RoundTrips)
	})
	b.WriteString("\nThe floor is the fewest Redis commands that keep this library's lock, lease, fence and " +
		"fingerprint ([bench/peers/floor](bench/peers/floor/main.go)); ")
	if hasKind("idemlease") {
		b.WriteString("idemlease is github.com/repenguin22/idemlease " + rep.Versions["idemlease"]["github.com/repenguin22/idemlease"] +
			" itself with its Redis store ([bench/peers/idemlease](bench/peers/idemlease/main.go)); ")
	}
	b.WriteString("the lease in record is a middleware of " +
		"github.com/repenguin22/idemlease's shape ([bench/peers/lease](bench/peers/lease/main.go)); Fiber's lock lives in one process's " +
		"memory. The whole run: [benchmarks](docs/benchmarks.md#against-idemleases-design-and-fiber-side-by-side).\n")
	return b.String()
}

// wrkLoad is the measured wrk command up to its script: "wrk -t1 -c16 -d6s".
func wrkLoad(measured string) string {
	load, _, _ := strings.Cut(measured, " --latency")
	return load
}
