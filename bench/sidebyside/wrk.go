package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// wrkResult is what wrk printed for one run.
type wrkResult struct {
	Requests     int64   `json:"requests"`
	RPS          float64 `json:"rps"`
	Non2xx       int64   `json:"non_2xx"`
	SocketErrors int64   `json:"socket_errors"`
	P50ms        float64 `json:"p50_ms"`
	P99ms        float64 `json:"p99_ms"`
	// CPU is wrk's own user and system time over the run.
	CPU time.Duration `json:"-"`
}

var (
	reRequests = regexp.MustCompile(`(\d+) requests in`)
	reRPS      = regexp.MustCompile(`Requests/sec:\s+([\d.]+)`)
	reNon2xx   = regexp.MustCompile(`Non-2xx or 3xx responses:\s+(\d+)`)
	reSocket   = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
	reLatency  = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$`)
)

// wrkArgs is wrk's command line for one run of script against url, with
// scriptArg after "--".
func wrkArgs(threads, conns int, d time.Duration, latency bool, script, url, scriptArg string) []string {
	args := []string{"-t" + strconv.Itoa(threads), "-c" + strconv.Itoa(conns), "-d" + seconds(d)}
	if latency {
		args = append(args, "--latency")
	}
	return append(args, "-s", script, url, "--", scriptArg)
}

func seconds(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s" }

// runWrk runs wrk and parses its summary. wrk runs in its own process
// group, so that a Ctrl-C reaches the driver, which stops it.
func runWrk(ctx context.Context, args []string, d time.Duration) (wrkResult, string, error) {
	var r wrkResult
	ctx, cancel := context.WithTimeout(ctx, d+15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "wrk", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	text := string(out)
	if err != nil {
		return r, text, fmt.Errorf("wrk %s: %w\n%s", strings.Join(args, " "), err, text)
	}
	r.CPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	m := reRPS.FindStringSubmatch(text)
	n := reRequests.FindStringSubmatch(text)
	if m == nil || n == nil {
		return r, text, fmt.Errorf("wrk %s: no summary in\n%s", strings.Join(args, " "), text)
	}
	r.RPS, _ = strconv.ParseFloat(m[1], 64)
	r.Requests, _ = strconv.ParseInt(n[1], 10, 64)
	if m := reNon2xx.FindStringSubmatch(text); m != nil {
		r.Non2xx, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reSocket.FindStringSubmatch(text); m != nil {
		for _, s := range m[1:] {
			v, _ := strconv.ParseInt(s, 10, 64)
			r.SocketErrors += v
		}
	}
	for _, m := range reLatency.FindAllStringSubmatch(text, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		switch m[3] {
		case "us":
			v /= 1000
		case "s":
			v *= 1000
		}
		if m[1] == "50" {
			r.P50ms = v
		} else {
			r.P99ms = v
		}
	}
	return r, text, nil
}

// wrkVersion is "wrk VERSION" from `wrk -v` (which exits non-zero).
func wrkVersion() string {
	out, _ := exec.Command("wrk", "-v").CombinedOutput()
	f := strings.Fields(string(out))
	if len(f) < 2 {
		return "wrk"
	}
	return f[0] + " " + f[1]
}
