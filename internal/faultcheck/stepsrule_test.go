package faultcheck_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"time"
)

// The rules of the steps workload (steps_test.go).
const (
	ruleStepTwice       = "a step's effect happened twice for one key"
	ruleStepRerun       = "a step journaled by one run ran again in a run that resumed it"
	ruleStepStale       = "a step journaled by one run ran again in an older run that went on after it"
	ruleStepClaimsLess  = "an answer claimed less than what took effect"
	ruleStepInterrupted = "a resumable key was answered interrupted"
	ruleStepUnanswered  = "a resumable key never reached its answer"
	ruleStepAnswer      = "an answer is not the one built from the steps' results"
	ruleStepUnexpected  = "a resumable key got an answer nothing in its history explains"
)

type stepsViolation struct {
	rule   string
	key    *stepsKey
	detail string
}

// checkSteps holds a settled steps history to the rules.
func checkSteps(h *stepsHistory) []stepsViolation {
	var found []stepsViolation
	for _, k := range h.plan.keys {
		fail := func(rule, format string, args ...any) {
			found = append(found, stepsViolation{rule, k, fmt.Sprintf(format, args...)})
		}
		traces := h.traces[k]
		// One effect per step: every run of a step calls with one step key.
		keys := map[string]map[string]bool{} // step → step keys
		for _, tr := range traces {
			if tr.Kind == stepRun {
				if keys[tr.Step] == nil {
					keys[tr.Step] = map[string]bool{}
				}
				keys[tr.Step][tr.StepKey] = true
			}
		}
		for step, ks := range keys {
			if len(ks) > 1 {
				fail(ruleStepTwice, "step %s ran under %d step keys, each an effect of its own", step, len(ks))
			}
		}
		// A journaled step never runs again: not in a later run (a higher
		// fence), nor in an older one that went on after it was journaled
		// (an executor paused while its key was taken over). The one
		// window left, a pause between a step's proof of ownership and its
		// call, is not told apart here: its run's trace comes after.
		for _, j := range traces {
			if j.Kind != stepJournaled {
				continue
			}
			for _, tr := range traces {
				if tr.Kind != stepRun || tr.Step != j.Step || tr.Exec == j.Exec {
					continue
				}
				switch {
				case tr.Fence > j.Fence:
					fail(ruleStepRerun, "step %s, journaled by %s (token %d), ran again in %s (token %d)",
						j.Step, j.Exec, j.Fence, tr.Exec, tr.Fence)
				case tr.At > j.At:
					fail(ruleStepStale, "step %s, journaled by %s (token %d), ran again %v later in %s (token %d)",
						j.Step, j.Exec, j.Fence, time.Duration(tr.At-j.At).Round(time.Millisecond), tr.Exec, tr.Fence)
				}
			}
		}
		for _, name := range claimedLess(traces, h.exchanges, k) {
			fail(ruleStepClaimsLess, "%s was answered \"not executed\" (store-unavailable) by a run whose step took effect", name)
		}
		// Answers: never interrupted; every 201 the same, built from the
		// steps' effects; and one at least.
		var first []byte
		for _, x := range h.exchanges {
			if x.key != k {
				continue
			}
			label := stepsLabel(x)
			switch {
			case label == "problem interrupted":
				fail(ruleStepInterrupted, "%s got 409 interrupted", x.name)
			case strings.HasPrefix(label, "undocumented"), label == "problem not-replayable", label == "problem unreadable-record":
				fail(ruleStepUnexpected, "%s got %d %q", x.name, x.status, x.body)
			}
			if x.err != nil || x.status != http.StatusCreated {
				continue
			}
			var a stepsAnswer
			json.Unmarshal(x.body, &a)
			if first != nil && !sameResults(first, a) {
				fail(ruleStepAnswer, "%s got %s, an earlier 201 was %s", x.name, x.body, first)
			}
			first = x.body
			if len(a.Results) != len(k.pauses) {
				fail(ruleStepAnswer, "%s got %d results for %d steps", x.name, len(a.Results), len(k.pauses))
				continue
			}
			for i, v := range a.Results {
				step := fmt.Sprint("s", i)
				for sk := range keys[step] {
					if effect := h.effects[k][sk]; effect != v {
						fail(ruleStepAnswer, "%s got %q for step %s, whose effect holds %q", x.name, v, step, effect)
					}
				}
			}
		}
		switch {
		case first == nil:
			fail(ruleStepUnanswered, "no 201 within %v (the record ends %q)", stepsBound, h.states[k])
		case h.states[k] == "done", h.claimedForGood[k], h.undecided[k]:
			// Stored, or left claimed by a process killed after its 201
			// (a retry resumes it), or undecided (tallied).
		default:
			fail(ruleStepUnanswered, "a 201 was answered, but the record ends %q although the process "+
				"that answered lived on, quiet for %v", h.states[k], storeQuiet)
		}
	}
	return found
}

// otherBuilders counts the 201s of k built by another run than the first
// 201 of k was.
func otherBuilders(exchanges []*stepsExchange, k *stepsKey) int {
	n, first := 0, ""
	for _, x := range exchanges {
		var a stepsAnswer
		if x.key != k || x.err != nil || x.status != http.StatusCreated || json.Unmarshal(x.body, &a) != nil {
			continue
		}
		switch {
		case first == "":
			first = a.Exec
		case a.Exec != first:
			n++
		}
	}
	return n
}

// staleStarts counts the runs that began a step's function after a run
// with a higher fence had started: what ruleStepStale is about (a paused
// executor that goes on), whether or not that step was journaled.
func staleStarts(traces []stepTrace) int {
	n := 0
	for _, tr := range traces {
		if tr.Kind != stepRun {
			continue
		}
		for _, s := range traces {
			if s.Kind == stepStart && s.Fence > tr.Fence && s.At < tr.At {
				n++
				break
			}
		}
	}
	return n
}

// sameResults reports whether a 201 carries the results of the earlier
// one, body: the steps' effects. Which run built it may differ: a run
// paused after its last step, whose key was taken over and answered
// meanwhile, still answers its own client when it goes on (tallied).
func sameResults(body []byte, a stepsAnswer) bool {
	var b stepsAnswer
	json.Unmarshal(body, &b)
	return slices.Equal(a.Results, b.Results) && a.Scope == b.Scope && a.Key == b.Key
}

// claimedLess names the requests of k answered "not executed" (503
// store-unavailable) by a run that applied or found a step's effect: a
// client that trusts it starts over with a new key, and the effect
// happens again.
func claimedLess(traces []stepTrace, exchanges []*stepsExchange, k *stepsKey) []string {
	request := map[string]string{} // run → the request it served
	took := map[string]bool{}      // requests whose run's step took effect
	for _, tr := range traces {
		switch tr.Kind {
		case stepStart:
			request[tr.Exec] = tr.Request
		case stepEffect:
			took[request[tr.Exec]] = true
		}
	}
	var names []string
	for _, x := range exchanges {
		if x.key == k && took[x.name] && stepsLabel(x) == "problem store-unavailable" {
			names = append(names, x.name)
		}
	}
	return names
}

// stepsLabel classifies an answer of the steps route.
func stepsLabel(x *stepsExchange) string {
	switch {
	case errors.Is(x.err, context.DeadlineExceeded):
		return "none: the client's deadline passed"
	case errors.Is(x.err, syscall.ECONNREFUSED):
		return "none: connection refused (instance down)"
	case x.err != nil:
		return "none: connection lost"
	}
	if strings.HasPrefix(x.header.Get("Content-Type"), "application/problem+json") {
		return readProblem(&x.exchange).label
	}
	switch {
	case x.status == http.StatusCreated && x.replayed():
		return "201 replayed"
	case x.status == http.StatusCreated:
		return "201"
	case x.status == http.StatusServiceUnavailable && x.header.Get(deliberateHeader) == "step-failed":
		return "503 the handler's own: a step failed"
	case x.status == http.StatusUnprocessableEntity && x.header.Get(deliberateHeader) == "released" && !x.replayed():
		return "422 the handler's own: it released the key after a step"
	}
	return fmt.Sprintf("undocumented %d", x.status)
}

// story tells what happened to key k in time order: its requests and
// answers, what its runs traced, and the faults around them.
func (h *stepsHistory) story(k *stepsKey) []string {
	type line struct {
		at   time.Time
		text string
	}
	began := h.run.began
	lines := []line{{began.Add(k.start), fmt.Sprintf("   key %s: steps %v, deaf %v, first client gives up after %v",
		k, k.pauses, k.deaf, k.giveUp)}}
	for _, x := range h.exchanges {
		if x.key != k {
			continue
		}
		reply := stepsLabel(x)
		if x.err == nil {
			reply += " " + string(x.body)
		}
		lines = append(lines, line{x.sent, fmt.Sprintf("%s  %s POST %s →", x.instance, x.name, routeSteps)},
			line{x.done, fmt.Sprintf("%s  %s ← %s", x.instance, x.name, reply)})
	}
	for _, tr := range h.traces[k] {
		text := fmt.Sprintf("%s  %s %s token %d", tr.Instance, tr.Exec, tr.Kind, tr.Fence)
		switch tr.Kind {
		case stepStart:
			text += " for " + tr.Request
		case stepRun:
			text += fmt.Sprintf(" %s key %s", tr.Step, tr.StepKey)
		case stepEffect:
			text += fmt.Sprintf(" %s → %q (new %v)", tr.Step, tr.Value, tr.New)
		case stepJournaled:
			text += fmt.Sprintf(" %s = %q", tr.Step, tr.Value)
		}
		lines = append(lines, line{time.Unix(0, tr.At), text})
	}
	for _, f := range h.run.faults {
		lines = append(lines, line{f.from, fmt.Sprintf("*  %s (until %+.3fs)", f.what, f.to.Sub(began).Seconds())})
	}
	lines = append(lines, line{h.run.settled, fmt.Sprintf("=  %s ends %q", k, h.states[k])})
	slices.SortStableFunc(lines, func(a, b line) int { return a.at.Compare(b.at) })
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = fmt.Sprintf("%+8.3fs  %s", l.at.Sub(began).Seconds(), l.text)
	}
	return out
}

// tallySteps counts what the history did that the rules are about: runs
// that resumed from a journal, and step calls repeated under their step key.
func tallySteps(h *stepsHistory, into map[string]int) {
	for kind, n := range h.run.injected {
		into["fault "+kind] += n
	}
	for _, k := range h.plan.keys {
		ran := map[string]map[string]bool{} // exec → steps it ran
		for _, tr := range h.traces[k] {
			switch tr.Kind {
			case stepRun:
				if ran[tr.Exec] == nil {
					ran[tr.Exec] = map[string]bool{}
				}
				ran[tr.Exec][tr.Step] = true
			case stepEffect:
				if !tr.New {
					into["step calls repeated under their step key"]++
				}
			}
		}
		into["older runs that started a step after their key was taken over"] += staleStarts(h.traces[k])
		into["201s built by another run than the key's other 201s"] += otherBuilders(h.exchanges, k)
		if h.undecided[k] {
			into["keys whose 201's store had not landed when the check stopped waiting for a quiet moment"]++
		}
		if h.claimedForGood[k] {
			into["keys left claimed by a process killed after its 201"]++
		}
		for _, x := range h.exchanges {
			var a stepsAnswer
			if x.key != k || x.err != nil || x.status != http.StatusCreated || x.replayed() || json.Unmarshal(x.body, &a) != nil {
				continue
			}
			if len(ran[a.Exec]) < len(a.Results) {
				into["201s of runs that resumed past journaled steps"]++
			}
		}
	}
}
