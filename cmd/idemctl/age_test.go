package main

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// A key claimed moments ago may belong to an executor that still runs:
// show and interrupted give its age, and resolve waits for -min-age.
func TestResolveWaitsForMinAge(t *testing.T) {
	s := newService(t)
	for _, key := range []string{"young", "forced", "early"} {
		if r := s.post(s.plain, "/plain", key); r.status != http.StatusAccepted {
			t.Fatalf("first request: %d %s", r.status, r.body)
		}
	}
	// Past the claim horizon of the default settings (37s), under -min-age.
	young := s.abandon("young", 60*time.Second)
	forced := s.abandon("forced", 60*time.Second)

	// Ages are read to the second: 1m0s, or a little more on a slow machine.
	expect(t, s.idemctl("", false, "show", young), 0, "claimed      1m", "s ago, by Redis TIME", "maybe still running", "under -min-age 2m0s")
	expect(t, s.idemctl("", false, "-min-age", "10s", "show", young), 0, "interrupted; its outcome is unknown")
	expect(t, s.idemctl("", false, "interrupted"), 0, young+"  fence=", "age=1m")

	r := s.idemctl("yes\n", false, "resolve", "-forget", "-yes", young)
	expect(t, r, 1)
	if !strings.Contains(r.stderr, young+" was claimed 1m") || !strings.Contains(r.stderr, "s ago, less than -min-age 2m0s") ||
		!strings.Contains(r.stderr, "nothing changed") || s.state(young) != "run" {
		t.Fatalf("a young key was settled, or not said why: %q, state %q", r.stderr, s.state(young))
	}
	expect(t, s.idemctl("", false, "resolve", "-forget", "-yes", "-min-age", "10s", young), 0, "claimed 1m", "Forgotten: "+young)
	expect(t, s.idemctl("", false, "resolve", "-forget", "-yes", "-force", forced), 0,
		"claimed 1m", "less than -min-age 2m0s", "Forgotten: "+forced)

	// Under the claim horizon, -force settles nothing: the executor may
	// still store its answer.
	early := s.abandon("early", 5*time.Second)
	expect(t, s.idemctl("", false, "show", early), 0, "run: its lock lapsed", "maybe still running", "even with -force")
	r = s.idemctl("", false, "resolve", "-forget", "-yes", "-force", early)
	expect(t, r, 1)
	if !strings.Contains(r.stderr, "may still store its answer") || s.state(early) != "run" {
		t.Fatalf("a key under the claim horizon was settled, or not said why: %q, state %q", r.stderr, s.state(early))
	}
}

// An executor whose lease lapsed (its lock expired in a Redis stall) while
// its handler still runs is not interrupted before the claim horizon, and
// resolve leaves it alone, even with -force.
func TestResolveLeavesARunningExecutorAlone(t *testing.T) {
	s := newService(t)
	done := make(chan reply, 1)
	go func() { done <- s.post(s.plain, "/slow", "s1") }()
	select {
	case <-s.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never started")
	}
	rec := s.record("s1")
	lock := strings.TrimSuffix(rec, ":r") + ":l"
	must(t, s.rdb.Del(t.Context(), lock).Err())

	expect(t, s.idemctl("", false, "show", rec), 0, "run: its lock lapsed", "maybe still running")
	r := s.idemctl("", false, "resolve", "-forget", "-yes", "-force", rec)
	expect(t, r, 1)
	if !strings.Contains(r.stderr, "may still store its answer") || s.state(rec) != "run" {
		t.Errorf("resolve settled a running executor's key: %q, state %q", r.stderr, s.state(rec))
	}
	close(s.release)
	<-done
}
