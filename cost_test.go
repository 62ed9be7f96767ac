//go:build idemcost

package idempotency

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkFirstExecutionCost measures what a first execution pays for each
// guarantee, by turning it off in this build (see costSwitches), with the
// CPU time of this process and of a private redis-server per request: one
// request at a time, so that waiting for Redis costs neither.
//
//	go test -tags idemcost -run '^$' -bench FirstExecutionCost -benchmem -count 6 .
//
// With -v, the "all" case also logs Redis's time per command name (INFO
// commandstats): what each script and each command inside one costs Redis.
func BenchmarkFirstExecutionCost(b *testing.B) {
	cases := []struct {
		name string
		off  costSwitches
		opts []Option
	}{
		{name: "all"},
		{name: "no-cache", opts: []Option{WithResponseCache(0, 0)}},
		{name: "no-watchdog", off: costSwitches{noWatchdog: true}},
		{name: "no-flights", off: costSwitches{noFlights: true}},
		{name: "no-admission", off: costSwitches{noAdmission: true}},
		{name: "no-exec-timeout", off: costSwitches{noExecTimeout: true}},
		{name: "no-outage", off: costSwitches{noOutage: true}},
		{name: "none", off: costSwitches{true, true, true, true, true}, opts: []Option{WithResponseCache(0, 0)}},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			srv := redistest.Private(b)
			rdb := srv.Client(b)
			cost = tc.off
			b.Cleanup(func() { cost = costSwitches{} })
			m := New(rdb, append([]Option{WithCallerCredentials()}, tc.opts...)...)
			h := m.ProtectKey(http.HandlerFunc(benchHandler))
			rig := newBenchRig("")
			// A warm-up loads the scripts and fills the pool.
			for i := range 100 {
				rig.req.Header[KeyHeader][0] = "warm-" + strconv.Itoa(i)
				rig.serve(b, h, http.StatusCreated)
			}
			ctx := context.Background()
			rdb.ConfigResetStat(ctx)
			redis0, cpu0 := redisCPU(b, rdb), processCPU()
			b.ReportAllocs()
			b.ResetTimer()
			rig.firstExecutions(b, h)
			b.StopTimer()
			n := float64(b.N)
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/n, "cpu-µs/op")
			b.ReportMetric(float64((redisCPU(b, rdb)-redis0).Microseconds())/n, "redis-µs/op")
			if tc.name == "all" && testing.Verbose() {
				b.Logf("Redis per first execution, by command: %s", commandCosts(b, rdb, n))
			}
		})
	}
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU is the CPU time the server has used, user and system.
func redisCPU(b *testing.B, rdb *redis.Client) time.Duration {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		name, value, _ := strings.Cut(line, ":")
		if name == "used_cpu_sys" || name == "used_cpu_user" {
			v, _ := strconv.ParseFloat(value, 64)
			total += v
		}
	}
	return time.Duration(total * float64(time.Second))
}

// commandCosts lists Redis's time per request in each command (a script's
// EVALSHA includes the commands it runs), and the calls per request.
func commandCosts(b *testing.B, rdb *redis.Client, n float64) string {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var parts []string
	for _, line := range strings.Split(info, "\r\n") {
		name, fields, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(line, "cmdstat_") || strings.HasPrefix(name, "info") || strings.HasPrefix(name, "config") {
			continue
		}
		var calls, usec float64
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseFloat(v, 64)
			case "usec":
				usec, _ = strconv.ParseFloat(v, 64)
			}
		}
		parts = append(parts, name+" "+strconv.FormatFloat(calls/n, 'f', 2, 64)+"× "+strconv.FormatFloat(usec/n, 'f', 2, 64)+" µs")
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}
