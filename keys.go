package idempotency

import (
	"crypto/sha256"
	"encoding/base64"
)

// keys names the Redis keys one protected request touches. They share one
// hash tag, so the scripts and the lock work on Redis Cluster:
//
//	token mode: PREFIX:{t<scope digest>}:tokens    sorted set of issued tokens
//	            PREFIX:{t<scope digest>}:r:<token> record hash
//	            PREFIX:{t<scope digest>}:l:<token> lock
//	key mode:   PREFIX:{k<scope+key digest>}:r     record hash
//	            PREFIX:{k<scope+key digest>}:l     lock
//
// A token-mode tag spreads scopes over the cluster and keeps one scope's
// tokens together so that issuing can cap them atomically. A key-mode tag
// hashes the client's key, so a busy route spreads over every shard and no
// client-chosen byte reaches a key name.
type keys struct {
	tokens string // empty in key mode
	record string
	lock   string
	token  string // the issued token, token mode only
}

func tokenSetKey(prefix, scope string) string {
	return prefix + ":{t" + digest(scope) + "}:tokens"
}

func tokenKeys(prefix, scope, token string) keys {
	tag := prefix + ":{t" + digest(scope) + "}:"
	return keys{tokens: tag + "tokens", record: tag + "r:" + token, lock: tag + "l:" + token, token: token}
}

func clientKeys(prefix, scope, key string) keys {
	tag := prefix + ":{k" + digest(scope+"\x00"+key) + "}:"
	return keys{record: tag + "r", lock: tag + "l"}
}

// digest shortens an arbitrary string to 128 bits, URL-safe and brace-free.
func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

func (k keys) redisKeys() []string {
	if k.tokens == "" {
		return []string{k.record, k.lock}
	}
	return []string{k.record, k.lock, k.tokens}
}
