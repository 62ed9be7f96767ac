package faultcheck_test

// A machine busy with other work can starve the check's processes: an
// instance that is not scheduled for a while misses its store timeout,
// and a waiter wakes late, though nothing came between it and Redis. The
// checker must not blame the middleware for that, nor excuse everything
// on a busy machine. So each process watches its own scheduling: a ticker
// that fires starvedAfter late marks the window on the timeline as a
// fault of kind starved, of the instance whose process it was (the
// instance prints it, starvedLine), or of every instance when it was the
// test process, which sends the requests and times the answers. The rules
// that excuse a disturbance excuse it; the report says how often it came.

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

const (
	kindStarved = "starved" // observed, never drawn: a process was not scheduled

	// starvedTick is how often a process looks; starvedAfter how late a
	// tick must be to count, well above a busy scheduler's jitter and
	// well below the shortest store timeout a history draws (150 ms).
	starvedTick  = 10 * time.Millisecond
	starvedAfter = 60 * time.Millisecond

	// starvedLine begins an instance's line of a window in which it was
	// not scheduled: the window's ends, in Unix nanoseconds.
	starvedLine = "faultcheck instance starved "
)

// watchScheduling calls starved with each window of starvedAfter or more
// in which this process was not scheduled, until stop closes.
func watchScheduling(stop <-chan struct{}, starved func(from, to time.Time)) {
	ticker := time.NewTicker(starvedTick)
	defer ticker.Stop()
	last := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
			now := time.Now() // the tick's own time says when it was due, not when it ran
			if now.Sub(last)-starvedTick >= starvedAfter {
				starved(last, now)
			}
			last = now
		}
	}
}

// printStarved is an instance's report of a window, for its rig.
func printStarved(from, to time.Time) {
	fmt.Printf("%s%d %d\n", starvedLine, from.UnixNano(), to.UnixNano())
}

// readWindow reads an instance's line of a window that begins with prefix
// (starvedLine, slowDialLine).
func readWindow(line, prefix string) (from, to time.Time, ok bool) {
	rest, ok := strings.CutPrefix(line, prefix)
	if !ok {
		return time.Time{}, time.Time{}, false
	}
	a, b, _ := strings.Cut(rest, " ")
	f, err1 := strconv.ParseInt(a, 10, 64)
	t, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, time.Time{}, false
	}
	return time.Unix(0, f), time.Unix(0, t), true
}

// markStarved puts a window in which instance i's process (-1: the test
// process) was not scheduled on the timeline.
func (r *rig) markStarved(i int, from, to time.Time) {
	who := "the test process"
	if i >= 0 {
		who = "instance " + instanceName(i) + "'s process"
	}
	r.markSlow(i, from, to, fmt.Sprintf("%s went %v unscheduled (the machine is busy)", who, (to.Sub(from)-starvedTick).Round(time.Millisecond)))
}

// markSlow puts a window in which instance i (-1: every instance) was
// slowed by the machine, not by a fault, on the timeline, as kindStarved.
func (r *rig) markSlow(i int, from, to time.Time, what string) {
	r.timeline.begin(faultEvent{kind: kindStarved, instance: i, history: -1, from: from, to: to, what: what})
	r.starved.Add(1)
}
