package main

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// maxKeyLength is the middleware's default limit on a key.
const maxKeyLength = 255

// messageKey names a message for the endpoint's idempotency key. It must
// be the same on every delivery of the message and differ between
// messages:
//
//   - When the publisher set Nats-Msg-Id, the key is that id (within its
//     stream). It names the event itself, so it also catches an event the
//     publisher sent twice (a publish whose acknowledgement was lost, resent
//     after JetStream's duplicate window), which the stream stored under two
//     sequence numbers.
//   - Otherwise the key is the stream sequence, which every redelivery of
//     the stored message carries. The consumer sequence would not do: it
//     grows with each delivery.
//
// Both carry the stream's name: a sequence is unique only within its
// stream, and JetStream deduplicates message ids per stream too.
func messageKey(header nats.Header, meta *jetstream.MsgMetadata) string {
	if id := header.Get(jetstream.MsgIDHeader); id != "" {
		return printableKey(meta.Stream + ":id:" + id)
	}
	return printableKey(meta.Stream + ":seq:" + strconv.FormatUint(meta.Sequence.Stream, 10))
}

// printableKey keeps a key within the middleware's rule (printable ASCII,
// at most 255 bytes) by digesting one that is not. A digest cannot be
// mistaken for a plain key: after "sha256:" comes a hex digit, never the
// "id:" or "seq:" of a plain key whose stream is named sha256.
func printableKey(key string) string {
	ok := len(key) <= maxKeyLength
	for i := 0; ok && i < len(key); i++ {
		ok = key[i] >= 0x20 && key[i] <= 0x7e
	}
	if ok {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}
