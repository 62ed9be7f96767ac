// Command idemctl shows the keys of github.com/onceonly/idempotency and
// settles the ones left interrupted: claimed by an instance that stopped
// before it stored an answer, and answered 409 interrupted until their
// record expires. It reads the keys in Redis (-redis, -cluster) or, for a
// middleware made by NewSQL, in its SQL table (-store, -store-table).
//
//	idemctl [flags] show KEY
//	idemctl [flags] interrupted
//	idemctl [flags] resolve -replay KEY   (needs -db)
//	idemctl [flags] resolve -forget KEY
//
// It exits 0 on success, 1 on failure (nothing changed, unless it says
// so) and 2 on a usage error. See docs/operations.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run runs the command that args name and returns its exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	cmd, err := parse(args, getenv)
	if err == nil {
		err = cmd.run(ctx, stdin, stdout, stderr)
	}
	var usage usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errHelp):
		fmt.Fprint(stdout, usageText)
		return 0
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "idemctl: %v\n\nRun idemctl -h for usage.\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "idemctl: %v\n", err)
	return 1
}
