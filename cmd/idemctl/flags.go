package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/sqlidem"
)

const usageText = `idemctl shows the keys of the idempotency middleware and settles the
ones left interrupted (claimed by an instance that stopped before it
stored an answer).

Usage:
  idemctl [flags] show KEY             what the store (Redis, or with -store its
                                       SQL table), and with -db SQL, hold for KEY
  idemctl [flags] interrupted          list the interrupted keys
  idemctl [flags] resolve -replay KEY  store the answer SQL committed for KEY in
                                       the store, so that retries replay it
                                       (needs -db)
  idemctl [flags] resolve -forget KEY  delete KEY's record, so that a retry runs
                                       the handler again
  idemctl [flags] token-keys           print the token secret that versions before
                                       the key ring kept in Redis, and those it
                                       retired, as a ring for ParseTokenKeys
                                       (sign=… revoked=…); it holds secrets
                                       (Redis only)

KEY is a record's Redis key as the middleware logs it (the "key" attribute,
PREFIX:{...}:r, which is also Execution.Key, sqlidem's record_key and the
id of its row in NewSQL's table), or the key of its lock or its waiters
flag. resolve asks for confirmation (type yes) unless -yes is given.

Flags, before or after the command:
  -redis URL        Redis, redis://[user:password@]host:port/db (default $REDIS_URL)
  -cluster ADDRS    a Redis Cluster instead: host:port,host:port,… or a URL,
                    redis://[user:password@]host:port?addr=host:port&addr=…
                    (default $REDIS_CLUSTER_ADDRS)
  -store URL        the SQL database of a middleware made by NewSQL, instead
                    of Redis: postgres://…, mysql://user:pw@host:port/db,
                    mysql://user:pw@tcp(host:port)/db, sqlite:PATH or file:PATH
  -store-table T    its keys table (WithSQLTable; default idempotency_keys)
  -prefix P         the middleware's key prefix (WithKeyPrefix; default idem)
  -db URL           the database of the sqlidem outcome store (default
                    $DATABASE_URL): postgres://…, mysql://user:pw@host:port/db,
                    mysql://user:pw@tcp(host:port)/db, sqlite:PATH or file:PATH;
                    another DSN needs -driver
  -driver D         sqlite, postgres or mysql
  -table T          the outcome table (default idempotency_outcomes)
  -timeout D        bound of each step against the store or SQL (default 10s)
  -limit N          interrupted: stop after N keys (default 1000; 0: all)

  -min-age D        resolve refuses, and show warns of, an interrupted key
                    claimed less than D ago (default 2m). A key whose lease
                    lapsed reads interrupted once the claim horizon of the
                    default settings has passed (37s: a 30s execution
                    timeout, a lease and four store timeouts); a service
                    with a longer WithExecutionTimeout may still be running
                    its executor then. Keep D above twice the service's
                    execution timeout: a recovering executor may take one
                    asking its outcome store, and another running the
                    handler.

resolve's flags:
  -force            settle a key younger than -min-age anyway (never one
                    younger than the claim horizon, whose executor may
                    still store its answer)
  -replay-headers H the service's WithReplayHeaders, comma-separated: -replay
                    then stores only those headers (default: every header but
                    Set-Cookie and the hop-by-hop ones, the middleware's default)
  -yes              do not ask for confirmation

Exit status: 0 success, 1 failure, 2 usage error.
`

// options are the flags of every command.
type options struct {
	redisURL, cluster, prefix string
	store, storeTable         string // NewSQL's database and table, instead of Redis
	dsn, driver, table        string
	timeout, minAge           time.Duration
	limit                     int
	replay, forget, yes       bool
	force                     bool
	replayHeaders             []string // nil: the middleware's default
}

// A command is a parsed command line, ready to run.
type command struct {
	name string
	key  string
	opts options
}

// usageError is a command line that names nothing to run.
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

var errHelp = errors.New("help requested")

// defaultMinAge is comfortably above the middleware's default execution
// timeout (30 s), after which no executor of the key can still be running.
const defaultMinAge = 2 * time.Minute

// resolveOnly names the flags that only resolve reads.
var resolveOnly = map[string]bool{"replay": true, "forget": true, "yes": true, "force": true, "replay-headers": true}

// flagSet registers every flag on fs, defaulting to what o holds, so that
// flags may come before and after the command name.
func flagSet(name string, o *options) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run reports errors once, with usageText for -h
	fs.StringVar(&o.redisURL, "redis", o.redisURL, "")
	fs.StringVar(&o.cluster, "cluster", o.cluster, "")
	fs.StringVar(&o.store, "store", o.store, "")
	fs.StringVar(&o.storeTable, "store-table", o.storeTable, "")
	fs.StringVar(&o.prefix, "prefix", o.prefix, "")
	fs.StringVar(&o.dsn, "db", o.dsn, "")
	fs.StringVar(&o.driver, "driver", o.driver, "")
	fs.StringVar(&o.table, "table", o.table, "")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "")
	fs.IntVar(&o.limit, "limit", o.limit, "")
	fs.BoolVar(&o.replay, "replay", o.replay, "")
	fs.BoolVar(&o.forget, "forget", o.forget, "")
	fs.BoolVar(&o.yes, "yes", o.yes, "")
	fs.BoolVar(&o.force, "force", o.force, "")
	fs.DurationVar(&o.minAge, "min-age", o.minAge, "")
	fs.Func("replay-headers", "", func(v string) error {
		o.replayHeaders = []string{}
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				o.replayHeaders = append(o.replayHeaders, name)
			}
		}
		return nil
	})
	return fs
}

// parse reads a command line: flags, the command, and its arguments, with
// flags also accepted between and after the arguments.
func parse(args []string, getenv func(string) string) (*command, error) {
	c := &command{opts: options{
		redisURL: getenv("REDIS_URL"), cluster: getenv("REDIS_CLUSTER_ADDRS"), prefix: "idem",
		storeTable: idempotency.DefaultSQLTable,
		dsn:        getenv("DATABASE_URL"), table: sqlidem.DefaultTable, timeout: 10 * time.Second, limit: 1000,
		minAge: defaultMinAge,
	}}
	fs := flagSet("idemctl", &c.opts)
	words, err := positionals(fs, args)
	if err != nil {
		return nil, err
	}
	var misplaced []string
	redisNamed := false // by a flag: the environment's REDIS_URL yields to -store
	fs.Visit(func(f *flag.Flag) {
		if resolveOnly[f.Name] {
			misplaced = append(misplaced, "-"+f.Name)
		}
		redisNamed = redisNamed || f.Name == "redis" || f.Name == "cluster"
	})
	if len(words) == 0 {
		return nil, usagef("no command: show, interrupted, resolve or token-keys")
	}
	c.name = words[0]
	want := map[string]int{"show": 1, "interrupted": 0, "resolve": 1, "token-keys": 0}
	n, known := want[c.name]
	switch {
	case !known:
		return nil, usagef("unknown command %q: show, interrupted, resolve or token-keys", c.name)
	case len(words)-1 != n:
		return nil, usagef("%s takes %d argument(s), got %d", c.name, n, len(words)-1)
	case n == 1:
		c.key = words[1]
	}
	o := c.opts
	switch {
	case c.name == "resolve" && o.replay == o.forget:
		return nil, usagef("resolve needs one of -replay and -forget")
	case c.name != "resolve" && len(misplaced) > 0:
		verb := map[bool]string{true: "belongs", false: "belong"}[len(misplaced) == 1]
		return nil, usagef("%s %s to resolve", strings.Join(misplaced, ", "), verb)
	case c.name == "resolve" && o.replay && o.dsn == "":
		return nil, usagef("resolve -replay reads the committed answer from SQL: pass -db or set DATABASE_URL")
	case o.store != "" && redisNamed:
		return nil, usagef("-store names the SQL store in place of Redis: pass -store or -redis/-cluster, not both")
	case o.store != "" && c.name == "token-keys":
		return nil, usagef("token-keys reads the token secret that versions before the key ring kept in Redis: " +
			"pass -redis, not -store")
	case o.store == "" && o.redisURL == "" && o.cluster == "":
		return nil, usagef("no Redis: pass -redis URL (or -cluster ADDRS), or set REDIS_URL; " +
			"or -store URL for a middleware made by NewSQL")
	case strings.ContainsAny(o.prefix, "{}"):
		return nil, usagef("-prefix %q: a key prefix has no braces", o.prefix)
	case o.timeout <= 0:
		return nil, usagef("-timeout must be positive")
	case o.minAge < 0:
		return nil, usagef("-min-age must be 0 or more")
	case o.limit < 0:
		return nil, usagef("-limit must be 0 (all) or more")
	}
	return c, nil
}

// positionals parses args with fs and returns the words that are not
// flags, wherever they stand.
func positionals(fs *flag.FlagSet, args []string) ([]string, error) {
	var words []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errHelp
			}
			return nil, usageError{err}
		}
		if fs.NArg() == 0 {
			return words, nil
		}
		words = append(words, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// run connects and runs the command.
func (c *command) run(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) error {
	s, err := connect(ctx, c.opts, stderr)
	if err != nil {
		return err
	}
	defer s.close()
	switch c.name {
	case "show":
		return s.show(ctx, stdout, c.key, c.opts.minAge)
	case "interrupted":
		return s.listInterrupted(ctx, stdout, stderr, c.opts.limit)
	case "token-keys":
		return s.tokenKeys(ctx, stdout, c.opts.prefix)
	}
	return s.resolve(ctx, stdin, stdout, c.key, c.opts)
}
