package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelSet is a primary, its replicas and three Sentinels that monitor
// them, all private to one test, on loopback. The Sentinels judge the
// primary down after a second without an answer, and two of them agreeing
// is enough to fail over to a replica.
type SentinelSet struct {
	Name      string // the primary's name in the Sentinels' configuration
	Primary   *Server
	Replica   *Server   // the first of Replicas
	Replicas  []*Server // in the order they were started
	Sentinels []*Server
	// Link, in a set started with SentinelOptions.Splittable, is the
	// network between the primary and the rest of the set: the Sentinels
	// and the replicas reach the primary through it, and its StartBlackhole
	// splits the primary off. Nil otherwise.
	Link *Proxy
	// Behind are the links to the replicas left on the primary's side of
	// a split (SentinelOptions.LeftBehind): they replicate the primary
	// directly, and the Sentinels and the other replicas reach them
	// through these. Split cuts them with Link.
	Behind []*Proxy
}

// SentinelOptions shape a SentinelSet.
type SentinelOptions struct {
	// Replicas is how many replicas the primary has (default 1).
	Replicas int
	// Splittable puts a proxy, Link, between the primary and the Sentinels
	// and replicas, so that a test can split the primary off while clients
	// made by PrimarySideClient still reach it.
	Splittable bool
	// LeftBehind, in a Splittable set, is how many of the replicas (the
	// last started) stay on the primary's side of a split: they keep
	// replicating it, and acknowledging its writes, while the Sentinels
	// and the other replicas cannot reach them.
	LeftBehind int
}

// SentinelDownAfter is how long the Sentinels of a SentinelSet wait for a
// primary that does not answer before they judge it down.
const SentinelDownAfter = time.Second

// Sentinel starts a SentinelSet with one replica: SentinelWith with the
// default options.
func Sentinel(t testing.TB) *SentinelSet {
	t.Helper()
	return SentinelWith(t, SentinelOptions{})
}

// SentinelWith starts a SentinelSet and returns once each Sentinel knows
// every replica and the other two Sentinels, and every replica
// acknowledges the primary's writes: from then on a failover can happen.
// Everything is stopped when t ends. Without a Sentinel program
// (SentinelCommand) the test is skipped, unless real Redis is required.
func SentinelWith(t testing.TB, opts SentinelOptions) *SentinelSet {
	t.Helper()
	program, _ := SentinelCommand()
	if _, err := exec.LookPath(program); err != nil {
		requireOrSkip(t, program+" is not on PATH, so no Sentinel")
	}
	if _, err := exec.LookPath(ServerCommand()); err != nil {
		requireOrSkip(t, ServerCommand()+" is not on PATH, so no Sentinel")
	}
	if opts.Replicas < 1 {
		opts.Replicas = 1
	}
	set := &SentinelSet{Name: "idempotency"}
	var err error
	// Diskless sync at once: whichever server is primary, its replicas
	// sync without the default 5 s delay.
	if set.Primary, err = StartServer("--repl-diskless-sync-delay", "0"); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(set.Primary.Stop)
	// The address by which the Sentinels and replicas know the primary.
	reach := set.Primary.Addr()
	if opts.Splittable {
		set.Link = NewProxy(t, set.Primary.Addr())
		reach = set.Link.Addr()
		// Once demoted, the old primary names itself to its new primary,
		// and so to the Sentinels, by the address they reach it by.
		_, port, _ := net.SplitHostPort(reach)
		c := redis.NewClient(&redis.Options{Addr: set.Primary.Addr()})
		err := c.ConfigSet(context.Background(), "replica-announce-port", port).Err()
		c.Close()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
	}
	if opts.LeftBehind > 0 && (!opts.Splittable || opts.LeftBehind >= opts.Replicas) {
		t.Fatalf("redistest: %d replicas left behind of %d, splittable %v: a split leaves at least one with the Sentinels",
			opts.LeftBehind, opts.Replicas, opts.Splittable)
	}
	for i := range opts.Replicas {
		var r *Server
		if i < opts.Replicas-opts.LeftBehind {
			r, err = StartReplica(reach)
		} else {
			r, err = set.startBehind(t)
		}
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		t.Cleanup(r.Stop)
		set.Replicas = append(set.Replicas, r)
	}
	set.Replica = set.Replicas[0]
	for range 3 {
		s, err := startSentinel(set.Name, reach)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		t.Cleanup(s.Stop)
		set.Sentinels = append(set.Sentinels, s)
	}
	if err := set.awaitReady(30 * time.Second); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return set
}

// startBehind starts a replica on the primary's side of a split: it
// replicates the primary itself, and names itself, to the primary and so
// to the Sentinels, by the address of a link of its own in Behind.
func (s *SentinelSet) startBehind(t testing.TB) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	link := NewProxy(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	_, announced, _ := net.SplitHostPort(link.Addr())
	host, primaryPort, _ := net.SplitHostPort(s.Primary.Addr())
	r, err := startOnPort(port, "--replicaof", host, primaryPort, "--repl-diskless-sync-delay", "0",
		"--replica-announce-port", announced)
	if err != nil {
		return nil, err
	}
	s.Behind = append(s.Behind, link)
	return r, nil
}

// Split cuts the network between the primary, with the replicas left
// behind, and the rest of the set (Link and Behind), until Heal.
func (s *SentinelSet) Split() {
	s.Link.StartBlackhole()
	for _, p := range s.Behind {
		p.StartBlackhole()
	}
}

// Heal ends Split.
func (s *SentinelSet) Heal() {
	s.Link.EndBlackhole()
	for _, p := range s.Behind {
		p.EndBlackhole()
	}
}

// StartReplica starts a private server that replicates primary (host:port).
func StartReplica(primary string) (*Server, error) {
	host, port, err := net.SplitHostPort(primary)
	if err != nil {
		return nil, err
	}
	return StartServer("--replicaof", host, port, "--repl-diskless-sync-delay", "0")
}

// RestartAsReplica starts a new server on the port of s, which must have
// stopped (killed, say), as a replica of primary: what a supervisor does
// with a crashed primary once Sentinel has promoted another. It is stopped
// when t ends.
func RestartAsReplica(t testing.TB, s *Server, primary string) *Server {
	t.Helper()
	host, port, err := net.SplitHostPort(primary)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	_, own, _ := net.SplitHostPort(s.Addr())
	p, _ := strconv.Atoi(own)
	s.Stop()
	var again *Server
	for range 50 { // the old process may hold the port for a moment
		if again, err = startOnPort(p, "--replicaof", host, port, "--repl-diskless-sync-delay", "0"); err == nil {
			t.Cleanup(again.Stop)
			return again
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("redistest: restarting on port %d: %v", p, err)
	return nil
}

// startSentinel starts a Sentinel that monitors the primary at addr under
// name. Sentinel rewrites its config file, so the file lives in the
// Sentinel's own directory.
func startSentinel(name, primary string) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	host, pport, err := net.SplitHostPort(primary)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-sentinel-")
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "sentinel.conf")
	ms := strconv.Itoa(int(SentinelDownAfter / time.Millisecond))
	lines := []string{
		"port " + strconv.Itoa(port),
		"bind 127.0.0.1",
		"daemonize no",
		"dir " + dir,
		"logfile " + filepath.Join(dir, "redis.log"),
		fmt.Sprintf("sentinel monitor %s %s %s 2", name, host, pport),
		fmt.Sprintf("sentinel down-after-milliseconds %s %s", name, ms),
		// A failover that stalls is tried again after twice this.
		fmt.Sprintf("sentinel failover-timeout %s 10000", name),
	}
	if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	program, sentinelMode := SentinelCommand()
	argv := []string{conf}
	if sentinelMode {
		argv = append(argv, "--sentinel")
	}
	return start(program, port, dir, argv)
}

// Addrs are the Sentinels' addresses.
func (s *SentinelSet) Addrs() []string {
	var addrs []string
	for _, sn := range s.Sentinels {
		addrs = append(addrs, sn.Addr())
	}
	return addrs
}

// Client returns a go-redis FailoverClient: it asks the Sentinels for the
// primary and follows them when they fail over. It is closed when t ends.
func (s *SentinelSet) Client(t testing.TB) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            s.Name,
		SentinelAddrs:         s.Addrs(),
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// PrimarySideClient is Client for a client on the primary's side of a
// split: asked for the primary's address behind Link, it dials the primary
// itself, so it keeps reaching the primary while Link is cut, and follows
// the Sentinels like any FailoverClient when they name another. Without
// Link it is Client.
func (s *SentinelSet) PrimarySideClient(t testing.TB) *redis.Client {
	if s.Link == nil {
		return s.Client(t)
	}
	behind, primary := s.Link.Addr(), s.Primary.Addr()
	dialer := &net.Dialer{Timeout: time.Second}
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            s.Name,
		SentinelAddrs:         s.Addrs(),
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == behind {
				addr = primary
			}
			return dialer.DialContext(ctx, network, addr)
		},
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// Master is the primary's address as the Sentinels name it, when a
// majority of them agree.
func (s *SentinelSet) Master(ctx context.Context) (string, error) {
	votes := map[string]int{}
	for _, sn := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr(), MaxRetries: -1})
		addr, err := c.GetMasterAddrByName(ctx, s.Name).Result()
		c.Close()
		if err == nil && len(addr) == 2 {
			votes[net.JoinHostPort(addr[0], addr[1])]++
		}
	}
	for addr, n := range votes {
		if n > len(s.Sentinels)/2 {
			return addr, nil
		}
	}
	return "", fmt.Errorf("no majority of the Sentinels names a primary: %v", votes)
}

// AwaitFailover waits until a majority of the Sentinels names a primary
// other than old, and that server answers as a primary; it returns its
// address.
func (s *SentinelSet) AwaitFailover(ctx context.Context, old string) (string, error) {
	for {
		if addr, err := s.Master(ctx); err == nil && addr != old {
			c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
			role, err := c.Do(ctx, "ROLE").Slice()
			c.Close()
			if err == nil && len(role) > 0 && role[0] == "master" {
				return addr, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no failover away from %s: %w", old, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// awaitReady waits until every Sentinel sees the primary up, with its
// replicas and two other Sentinels, and every replica acknowledges writes.
func (s *SentinelSet) awaitReady(limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var last string
	for _, sn := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr(), MaxRetries: -1})
		for {
			m, err := c.Master(ctx, s.Name).Result()
			if err == nil && m["flags"] == "master" && m["num-slaves"] == strconv.Itoa(len(s.Replicas)) && m["num-other-sentinels"] == "2" {
				break
			}
			last = fmt.Sprintf("Sentinel %s: %v %v", sn.Addr(), m, err)
			select {
			case <-ctx.Done():
				c.Close()
				return fmt.Errorf("Sentinels not ready: %s", last)
			case <-time.After(50 * time.Millisecond):
			}
		}
		c.Close()
	}
	// WAIT counts acknowledgements of its own connection's writes, so the
	// probe writes and waits on one connection.
	c := redis.NewClient(&redis.Options{Addr: s.Primary.Addr(), PoolSize: 1})
	defer c.Close()
	for {
		if c.Set(ctx, "redistest-replica-probe", "1", time.Minute).Err() == nil &&
			c.Wait(ctx, len(s.Replicas), 100*time.Millisecond).Val() == int64(len(s.Replicas)) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the replicas never all acknowledged a write")
		case <-time.After(20 * time.Millisecond):
		}
	}
}
