package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	env := map[string]string{"REDIS_URL": "redis://r:6379/0", "DATABASE_URL": "postgres://db/app"}
	c, err := parse([]string{"-prefix", "shop", "resolve", "K", "-replay", "-yes"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	o := c.opts
	if c.name != "resolve" || c.key != "K" || !o.replay || !o.yes || o.prefix != "shop" ||
		o.redisURL != env["REDIS_URL"] || o.dsn != env["DATABASE_URL"] {
		t.Errorf("flags before, between and after the words: %+v", c)
	}
	if o.minAge != 2*time.Minute || o.force {
		t.Errorf("resolve's defaults: -min-age %v, -force %v", o.minAge, o.force)
	}

	c, err = parse([]string{"resolve", "-forget", "-force", "-min-age", "10m", "K"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if o := c.opts; o.minAge != 10*time.Minute || !o.force {
		t.Errorf("-min-age %v, -force %v", o.minAge, o.force)
	}
	c, err = parse([]string{"show", "-min-age", "1m", "K"}, func(k string) string { return env[k] })
	if err != nil || c.opts.minAge != time.Minute {
		t.Errorf("show takes -min-age for its verdict: %v", err)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"drop"}, "unknown command"},
		{[]string{"show"}, "show takes 1 argument(s), got 0"},
		{[]string{"show", "a", "b"}, "got 2"},
		{[]string{"interrupted", "a"}, "interrupted takes 0"},
		{[]string{"resolve", "K"}, "one of -replay and -forget"},
		{[]string{"resolve", "-replay", "-forget", "K"}, "one of -replay and -forget"},
		{[]string{"show", "-yes", "K"}, "-yes belongs to resolve"},
		{[]string{"-force", "interrupted", "-yes"}, "-force, -yes belong to resolve"},
		{[]string{"-min-age", "-1s", "resolve", "-forget", "K"}, "-min-age must be 0 or more"},
		{[]string{"-db", "", "resolve", "-replay", "K"}, "pass -db or set DATABASE_URL"},
		{[]string{"-redis", "", "show", "K"}, "no Redis"},
		{[]string{"-prefix", "a{b}", "show", "K"}, "has no braces"},
		{[]string{"-timeout", "0s", "show", "K"}, "-timeout"},
		{[]string{"-limit", "-1", "interrupted"}, "-limit"},
		{[]string{"-nope", "show", "K"}, "not defined"},
		{[]string{"-redis", "http://x", "show", "K"}, "-redis"},
		{[]string{"-db", "app.db", "show", "K"}, "pass -driver"},
	} {
		var stdout, stderr bytes.Buffer
		env := func(k string) string { return map[string]string{"REDIS_URL": "redis://127.0.0.1:1"}[k] }
		code := run(context.Background(), tc.args, strings.NewReader(""), &stdout, &stderr, env)
		if code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, %q; want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}
