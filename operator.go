package idempotency

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/idempotency/internal/keyspace"
)

// operatorView is how the operator's API (package admin) reaches a
// middleware's records: Middleware embeds it, under this unexported name,
// and keyspace.StoreOf reads it, so that admin needs nothing unexported of
// this package and this package's API gains nothing.
type operatorView = keyspace.Operated

// operated is the middleware's records as an operator sees them: in Redis,
// or in NewSQL's table.
func (m *Middleware) operated() *keyspace.Store {
	var (
		client redis.UniversalClient
		rows   *keyspace.SQLRows
	)
	if m.redis != nil {
		client = m.redis.client
	} else if s, ok := m.keyStore.(*sqlStore); ok {
		// SQLite: the operator's settle takes the lock of the process that
		// the store's own operations take.
		rows = &keyspace.SQLRows{DB: s.db, Dialect: s.dialect, Table: s.table, Serial: &s.serial}
	}
	return &keyspace.Store{
		Client:    client,
		SQL:       rows,
		Prefix:    m.cfg.prefix,
		RecordTTL: m.cfg.recordTTL,
		Horizon:   m.cfg.claimHorizon(),
		KeyReused: ErrKeyReused,
		Record: func(status int, header http.Header, body []byte, notReplayable bool) (string, int, string, []byte, error) {
			rec, state := m.recordOf(Answer{Status: status, Header: header, Body: body}), "done"
			if notReplayable || len(rec.body) > m.cfg.maxResponse {
				// As for a handler's answer over the limit: executed, and
				// answered not-replayable rather than replayed in part or
				// beyond the bound.
				rec, state = newRecord(rec.status, nil, nil), "big"
			} else if err := m.decodes(rec); err != nil {
				return "", 0, "", nil, err
			}
			return state, rec.status, encodeHeader(rec.header), rec.body, nil
		},
	}
}

// decodes reports why a replay could not decode rec's body for a client
// that does not accept its coding (a Content-Encoding of gzip or deflate
// over bytes that are not), or nil: an operator's answer is checked
// before it becomes the key's, since every such retry would be answered
// 409 unreadable-record for the record's whole life.
func (m *Middleware) decodes(rec *record) error {
	if !decodable(rec.coding()) {
		return nil
	}
	if _, err := rec.decodingOf(m.cfg.decodedLimit()); err != nil && !errors.Is(err, errDecodedTooLarge) {
		return fmt.Errorf("admin: the answer's body is not %s, as its Content-Encoding says: %w", rec.coding(), err)
	}
	return nil
}
