package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Where a request's time goes, beyond req/s: with the servers, Redis and
// wrk on the same cores, a server that makes Redis work harder is slower
// although its own process is not. So each run also reads the CPU time
// that the server's process, redis-server and wrk spent during it.

// clockTicks is the unit of /proc/PID/stat's times: USER_HZ, which Linux
// fixes at 100 for user space whatever the kernel's own tick rate.
const clockTicks = 100

// processCPU is the user and system CPU time of every thread of process
// pid so far, from /proc; false where there is no /proc.
func processCPU(pid int) (time.Duration, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name (field 2) is in parentheses and may hold spaces;
	// utime and stime are fields 14 and 15, the 12th and 13th after it.
	text := string(data)
	end := strings.LastIndexByte(text, ')')
	if end < 0 {
		return 0, false
	}
	f := strings.Fields(text[end+1:])
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, true
}

// redisCPU is redis-server's CPU time so far, as it reports it (INFO cpu:
// used_cpu_user plus used_cpu_sys, every thread of the server).
func redisCPU(ctx context.Context, rdb *redis.Client) (time.Duration, bool) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, false
	}
	var total float64
	found := 0
	for _, line := range strings.Split(info, "\r\n") {
		name, value, ok := strings.Cut(line, ":")
		if !ok || (name != "used_cpu_user" && name != "used_cpu_sys") {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return 0, false
		}
		total += v
		found++
	}
	if found != 2 {
		return 0, false
	}
	return time.Duration(total * float64(time.Second)), true
}

// A runMeter reads, before and after a run, the CPU time of its server
// and of Redis, and Redis's command statistics.
type runMeter struct {
	pid                 int
	rdb                 *redis.Client
	server, inRedis     time.Duration
	serverOK, inRedisOK bool
	commands            map[string]commandStat
}

// A meter reads what a run cost per request: CPU time of the server and
// of its store, and (Redis) the store's time in scripts and commands.
type meter interface {
	cpuPerRequest(ctx context.Context, requests int64) (server, store float64)
	commandTime(ctx context.Context, requests int64) (scripts, commands float64)
}

// A startMeter starts a meter for a run of instance in.
type startMeter func(ctx context.Context, in *instance) meter

// redisMeter meters a server on rdb's Redis.
func redisMeter(rdb *redis.Client) startMeter {
	return func(ctx context.Context, in *instance) meter { return startRunMeter(ctx, in.cmd.Process.Pid, rdb) }
}

func startRunMeter(ctx context.Context, pid int, rdb *redis.Client) *runMeter {
	m := &runMeter{pid: pid, rdb: rdb}
	m.server, m.serverOK = processCPU(pid)
	m.inRedis, m.inRedisOK = redisCPU(ctx, rdb)
	m.commands, _ = commandStats(ctx, rdb)
	return m
}

// cpuPerRequest is the microseconds of CPU per request that the server and
// Redis spent since the meter started; 0 for what could not be read.
func (m *runMeter) cpuPerRequest(ctx context.Context, requests int64) (server, inRedis float64) {
	if requests <= 0 {
		return 0, 0
	}
	if s, ok := processCPU(m.pid); ok && m.serverOK {
		server = micros(s-m.server) / float64(requests)
	}
	if r, ok := redisCPU(ctx, m.rdb); ok && m.inRedisOK {
		inRedis = micros(r-m.inRedis) / float64(requests)
	}
	return server, inRedis
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// commandTime is Redis's time per request in scripts and in commands since
// the meter started (see the function commandTime).
func (m *runMeter) commandTime(ctx context.Context, requests int64) (scripts, commands float64) {
	after, err := commandStats(ctx, m.rdb)
	if err != nil || m.commands == nil {
		return 0, 0
	}
	return commandTime(m.commands, after, requests)
}
