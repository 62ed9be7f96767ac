// Package consumer_test runs the queue consumer loop of docs/queues.md
// over a real NATS JetStream server, with results of every kind.
package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// settle is the consumer loop's decision of docs/queues.md, word for word.
func settle(msg jetstream.Msg, err error, deadLetter func(jetstream.Msg, error) error) error {
	var stored *idempotency.StoredError
	switch {
	case err == nil, errors.Is(err, idempotency.ErrNotReplayable), errors.As(err, &stored):
		return msg.Ack() // it ran: its result, one that could not be kept, or its stored failure
	case errors.Is(err, idempotency.ErrInProgress), errors.Is(err, idempotency.ErrStoreUnavailable):
		return msg.NakWithDelay(idempotency.RetryAfter(err)) // running elsewhere, or Redis down: nothing ran
	case errors.Is(err, idempotency.ErrKeyReused), errors.Is(err, idempotency.ErrInterrupted),
		errors.Is(err, idempotency.ErrUnreadableRecord), errors.Is(err, idempotency.ErrMissingKey),
		errors.Is(err, idempotency.ErrInvalidKey):
		return deadLetter(msg, err) // every redelivery would get the same: a person decides
	default:
		return msg.NakWithDelay(time.Second) // the function's own error: the key was released, it runs again
	}
}

type receipt struct {
	Order   string
	Amount  int64
	Raw     []byte
	Labels  map[string]string
	Warning error
}

// kinds are results of every kind, each the result of one message.
var kinds = map[string]any{
	"struct":              receipt{Order: "o-1", Amount: 1<<53 + 1, Raw: []byte{0, 0xff}, Labels: map[string]string{"a": "b"}},
	"map":                 map[string]any{"order": "o-2", "paid": true, "items": []any{"x", float64(2)}},
	"int64 past 2^53":     int64(1<<53 + 1),
	"bytes":               []byte("\xff\xfe\x00"),
	"string":              "café",
	"string not UTF-8":    "caf\xe9",
	"int64 in an any":     map[string]any{"id": int64(1<<53 + 1)},
	"interface field":     receipt{Order: "o-3", Warning: errors.New("low balance")},
	"interface field nil": receipt{Order: "o-4"},
}

// A delivery is what one delivery of a message got from Do.
type delivery struct {
	value any
	err   error
}

func TestConsumerLoopOverJetStream(t *testing.T) {
	url := os.Getenv("NATS_URL")
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second))
	if err != nil {
		t.Skipf("no NATS server at %s (%v); skipping. Run nats-server -js, or set NATS_URL.", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	name := fmt.Sprintf("CONSUMERLOOP_%d", time.Now().UnixNano())
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
	if err != nil {
		t.Skipf("the NATS server at %s has no JetStream (%v); skipping. Run nats-server -js.", url, err)
	}
	t.Cleanup(func() { js.DeleteStream(context.Background(), name) })

	idem := idempotency.New(redistest.Client(t, name), idempotency.WithKeyPrefix(name))
	var mu sync.Mutex
	effects := map[string]int{}
	got := map[string][]delivery{}
	var dead []string

	// Each message is published twice (a publisher's resend under the same
	// id), and the first delivery of each loses its ack: JetStream
	// redelivers it after AckWait.
	for id := range kinds {
		for range 2 {
			m := nats.NewMsg(name + ".orders")
			m.Header.Set("Msg-Id", id)
			m.Data = []byte(id)
			_, err := js.PublishMsg(ctx, m)
			require.NoError(t, err)
		}
	}
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 300 * time.Millisecond})
	require.NoError(t, err)
	seen := map[string]bool{}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		id := msg.Headers().Get("Msg-Id")
		key := idempotency.Key{Scope: name, ID: id, Input: msg.Data()}
		v, err := idempotency.Do(ctx, idem, key, func(ctx context.Context) (any, error) {
			mu.Lock()
			effects[id]++
			mu.Unlock()
			return kinds[id], nil
		})
		mu.Lock()
		got[id] = append(got[id], delivery{v, err})
		first := !seen[id]
		seen[id] = true
		mu.Unlock()
		if first {
			return // the ack is lost: redelivered after AckWait
		}
		require.NoError(t, settle(msg, err, func(msg jetstream.Msg, err error) error {
			mu.Lock()
			dead = append(dead, fmt.Sprintf("%s: %v", id, err))
			mu.Unlock()
			return msg.Term()
		}))
	})
	require.NoError(t, err)
	defer cc.Stop()

	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0 && info.Delivered.Consumer >= uint64(3*len(kinds))
	}, 30*time.Second, 50*time.Millisecond, "every message settled")
	cc.Stop()

	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, dead, "no processed message is dead-lettered")
	for id, want := range kinds {
		t.Run(id, func(t *testing.T) {
			require.Equal(t, 1, effects[id], "one effect per message")
			ds := got[id]
			require.GreaterOrEqual(t, len(ds), 3, "the first delivery, its redelivery, and the resend")
			require.Equal(t, want, ds[0].value, "the first delivery gets its function's result")
			replayable := ds[0].err == nil
			if !replayable {
				require.ErrorIs(t, ds[0].err, idempotency.ErrNotReplayable, "refused at the first execution")
			}
			for _, d := range ds[1:] {
				if replayable {
					require.NoError(t, d.err)
					require.Equal(t, ds[0].value, d.value, "a redelivery gets the exact result")
				} else {
					require.ErrorIs(t, d.err, idempotency.ErrNotReplayable)
				}
			}
		})
	}
}
