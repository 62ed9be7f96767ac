// Command serverversion starts a private Redis server the way the tests do
// (IDEMPOTENCY_REDIS_SERVER, else redis-server from PATH), prints the
// server's name and version as its INFO server reports them, and stops it:
// the test command names every server it tests on from the server itself,
// not from a package's version.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func main() {
	s, err := redistest.StartServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, "serverversion:", err)
		os.Exit(1)
	}
	defer s.Stop()
	c := redis.NewClient(s.Options())
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := redistest.Version(ctx, c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "serverversion:", err)
		s.Stop()
		os.Exit(1)
	}
	fmt.Println(v)
}
