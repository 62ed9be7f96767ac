module github.com/onceonly/idempotency/sqlidem

go 1.26.0

require (
	github.com/onceonly/idempotency v0.1.0
	github.com/onceonly/idempotency/sqldialect v0.1.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
