package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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
	if o.minAge != 2*time.Minute || o.force || o.replayHeaders != nil {
		t.Errorf("resolve's defaults: -min-age %v, -force %v, -replay-headers %q", o.minAge, o.force, o.replayHeaders)
	}

	c, err = parse([]string{"resolve", "-forget", "-force", "-min-age", "10m", "-replay-headers", "Location, X-Id", "K"},
		func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if o := c.opts; o.minAge != 10*time.Minute || !o.force || !slices.Equal(o.replayHeaders, []string{"Location", "X-Id"}) {
		t.Errorf("-min-age %v, -force %v, -replay-headers %q", o.minAge, o.force, o.replayHeaders)
	}
	c, err = parse([]string{"show", "-min-age", "1m", "K"}, func(k string) string { return env[k] })
	if err != nil || c.opts.minAge != time.Minute {
		t.Errorf("show takes -min-age for its verdict: %v", err)
	}
}

// A cluster is named by its addresses, or by a URL that can carry a
// user and password.
func TestClusterOptions(t *testing.T) {
	for _, tc := range []struct {
		cluster, user, password string
		addrs                   []string
	}{
		{"h1:7000,h2:7001", "", "", []string{"h1:7000", "h2:7001"}},
		{"redis://ops:p%40ss@h1:7000?addr=h2:7001&addr=h3:7002", "ops", "p@ss", []string{"h1:7000", "h2:7001", "h3:7002"}},
	} {
		rdb, err := openRedis(options{cluster: tc.cluster})
		if err != nil {
			t.Fatal(err)
		}
		o := rdb.(*redis.ClusterClient).Options()
		rdb.Close()
		if o.Username != tc.user || o.Password != tc.password || !slices.Equal(o.Addrs, tc.addrs) || !o.ContextTimeoutEnabled {
			t.Errorf("%s: %+v", tc.cluster, o)
		}
	}
	_, err := openRedis(options{cluster: "redis://u:secret@h1:7000?addr=h2:7001&dial_timeout=soon"})
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("a bad cluster URL: %v", err)
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
		{[]string{"-force", "interrupted", "-replay-headers", "X"}, "-force, -replay-headers belong to resolve"},
		{[]string{"-min-age", "-1s", "resolve", "-forget", "K"}, "-min-age must be 0 or more"},
		{[]string{"-cluster", "redis://u:secret@h:1?addr=h:2&dial_timeout=soon", "show", "K"}, "-cluster"},
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

// A Redis URL that does not parse is refused without quoting any part of
// it: url.Parse's message would show the start of a password with a raw /.
func TestRedisURLErrorsQuoteNoPassword(t *testing.T) {
	for _, flag := range []string{"-redis", "-cluster"} {
		url := "redis://ops:pa/ssword@h:6379"
		if flag == "-cluster" {
			url += "?addr=h2:6379"
		}
		o := options{redisURL: url}
		if flag == "-cluster" {
			o = options{cluster: url}
		}
		_, err := openRedis(o)
		if err == nil || strings.Contains(err.Error(), ":pa") || strings.Contains(err.Error(), "pa/ss") {
			t.Errorf("%s %s: %v; want an error that quotes no part of the password", flag, url, err)
		}
	}
}
