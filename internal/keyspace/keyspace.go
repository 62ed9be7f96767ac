package keyspace

import (
	"fmt"
	"strings"
)

// Names are the Redis keys of one protected key: its record, its
// lock, and in token mode the token they end in. The middleware builds them
// on its hot path, where keys.go in the root lays out their hash tags; the
// operator reads them back with Parse, and both name the waiters flag with
// Waiters.
type Names struct {
	Record string
	Lock   string
	Token  string // token mode only
}

// Waiters names the flag (and pub/sub channel) of record's waiters.
func Waiters(record string) string { return record + ":w" }

// operated lists the keys the operator's scripts read: record, lock and
// waiters flag.
func (k Names) operated() []string { return []string{k.Record, k.Lock, Waiters(k.Record)} }

// Parse returns the keys of the record that name belongs to: the
// record's own name, its lock's or its waiters flag's (keys.go).
func Parse(prefix, name string) (Names, error) {
	bad := fmt.Errorf("admin: %q names no record, lock or waiters flag under the key prefix %q", name, prefix)
	rest, ok := strings.CutPrefix(name, prefix+":{")
	end := strings.Index(rest, "}:")
	if !ok || end < 2 {
		return Names{}, bad
	}
	tag, kind := name[:len(name)-len(rest)+end+2], rest[0]
	rest, waiters := strings.CutSuffix(rest[end+2:], ":w")
	switch kind {
	case 'k':
		if rest == "r" || (rest == "l" && !waiters) {
			return Names{Record: tag + "r", Lock: tag + "l"}, nil
		}
	case 't':
		role, token, _ := strings.Cut(rest, ":")
		if token != "" && !strings.Contains(token, ":") && (role == "r" || (role == "l" && !waiters)) {
			return Names{Record: tag + "r:" + token, Lock: tag + "l:" + token, Token: token}, nil
		}
	}
	return Names{}, bad
}
