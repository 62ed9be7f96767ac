package optimistic

import (
	"context"
	_ "embed"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed cas.lua
	casSource string
	casScript = redis.NewScript(casSource)
)

// Hash names the fields that guard Redis hashes: a version field for
// CompareAndSet and Read, a fence field for FencedSet. The zero Hash uses
// the defaults. Every call touches the one key it is given, so all of them
// work on Redis Cluster.
type Hash struct {
	// VersionField holds the hash's version. Default "version".
	VersionField string
	// FenceField holds the highest fencing token the hash accepted.
	// Default "fence".
	FenceField string
}

// HashReader is what Read needs; every go-redis client, pipeline and
// transaction has it.
type HashReader interface {
	HGetAll(ctx context.Context, key string) *redis.MapStringStringCmd
}

// Read returns the hash's fields, without the version field, and its
// version. A missing hash reads as no fields at version 0, which is what
// CompareAndSet expects to create it, so read-modify-write loops need no
// special first case.
func (h Hash) Read(ctx context.Context, rdb HashReader, key string) (map[string]string, int64, error) {
	fields, err := rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("optimistic: reading hash %s: %w", key, err)
	}
	vf := h.versionField()
	text, ok := fields[vf]
	if !ok {
		if len(fields) > 0 {
			return nil, 0, fmt.Errorf("optimistic: hash %s has no version field %q", key, vf)
		}
		return fields, 0, nil
	}
	delete(fields, vf)
	version, err := strconv.ParseInt(text, 10, 64)
	if err != nil || version < 0 {
		return nil, 0, fmt.Errorf("optimistic: hash %s: version field %q holds %q", key, vf, text)
	}
	return fields, version, nil
}

// CompareAndSet writes fields to the hash at key only if the hash is at
// version expected, and increments the version, atomically in one script.
// expected 0 means the hash must not exist yet; it is then created at
// version 1. It returns the new version.
//
// A hash at another version gets a *ConflictError matching ErrConflict,
// carrying the current version; a missing hash (with expected > 0) gets one
// with Missing set, which matches ErrNotFound too. An existing hash without
// the version field is refused with an error that is not a conflict.
// fields must not name the version field or the fence field (see
// FencedSet); values are anything go-redis accepts as an argument
// (strings, []byte, numbers, bools).
func (h Hash) CompareAndSet(ctx context.Context, rdb redis.Scripter, key string, expected int64, fields map[string]any) (int64, error) {
	if expected < 0 {
		return 0, fmt.Errorf("optimistic: hash %s: negative expected version %d", key, expected)
	}
	args, err := fieldArgs(key, fields, h.versionField(), strconv.FormatInt(expected, 10), h.fenceField())
	if err != nil {
		return 0, err
	}
	reply, err := casScript.Run(ctx, rdb, []string{key}, args...).Slice()
	if err != nil {
		return 0, fmt.Errorf("optimistic: compare-and-set of hash %s: %w", key, err)
	}
	text, _ := reply[1].(string)
	version, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("optimistic: hash %s: version field %q holds %q", key, h.versionField(), text)
	}
	if ok, _ := reply[0].(int64); ok == 1 {
		return version, nil
	}
	exists, _ := reply[2].(int64)
	return 0, &ConflictError{Resource: "hash " + key, Expected: expected, Current: version, Missing: exists == 0}
}

func (h Hash) versionField() string { return orDefault(h.VersionField, "version") }
func (h Hash) fenceField() string   { return orDefault(h.FenceField, "fence") }

// fieldArgs lays out a script's ARGV: the guard field and its value, then
// the fields in name order (so the same call always sends the same
// command), refusing a field that would overwrite the guard or the other
// helper's field (the version beside a fence, the fence beside a version).
func fieldArgs(key string, fields map[string]any, guard, value, other string) ([]any, error) {
	args := make([]any, 0, 2+2*len(fields))
	args = append(args, guard, value)
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		if name == guard || name == other {
			return nil, fmt.Errorf("optimistic: hash %s: field %q is managed by the helper and cannot be set", key, name)
		}
		args = append(args, name, fields[name])
	}
	return args, nil
}
