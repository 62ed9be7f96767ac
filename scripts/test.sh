#!/usr/bin/env bash
# Runs every test against real servers: installs redis-server when it is
# missing, points the SQL tests at PostgreSQL and MariaDB when they answer on
# loopback, then runs gofmt, go vet and go test -race. The tests start
# their own private redis-server processes (one per test package, plus a
# 3-master Redis Cluster) on free loopback ports and stop them when they
# finish; IDEMPOTENCY_REQUIRE_REDIS=1 makes them fail instead of falling
# back to the embedded Redis. REDIS_URL or REDIS_CLUSTER_ADDRS, when set,
# point the tests at servers of your own instead; they only delete the keys
# they wrote.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
updated=""
apt_install() { # apt_install WHY PACKAGE…: one apt-get update per run
	echo "test.sh: $1; installing $(echo "${@:2}") with apt-get"
	if [ -z "$updated" ]; then
		$sudo apt-get update -qq
		updated=1
	fi
	# RUNLEVEL=1: installing redis-server must not start a system-wide
	# server; the tests start their own.
	RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${@:2}" >/dev/null
}

# Go fetches modules over TLS, and a minimal Debian has no CA certificates.
if [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then
	apt_install "no CA certificates (go needs them to download modules)" ca-certificates
fi
# go test -race needs cgo, and cgo a C compiler.
if ! command -v gcc >/dev/null; then
	apt_install "no C compiler (go test -race needs cgo)" gcc libc6-dev
fi
export CGO_ENABLED=1
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
	apt_install "redis-server not found" redis-server
fi
echo "test.sh: $(redis-server --version)"

# The browser tests (e2e/) drive Debian's chromium, headless; with
# IDEMPOTENCY_REQUIRE_BROWSER=1 they fail instead of skipping without it.
if ! command -v chromium >/dev/null; then
	apt_install "chromium not found" chromium
fi
echo "test.sh: $(chromium --version 2>/dev/null)"
export IDEMPOTENCY_REQUIRE_BROWSER=1

# SQL helpers run on SQLite always, and on PostgreSQL and MariaDB/MySQL when
# they answer on loopback (or when POSTGRES_DSN / MYSQL_DSN are already set).
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if [ -z "${POSTGRES_DSN:-}" ] && listening 5432; then
	export POSTGRES_DSN="postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
fi
if [ -z "${MYSQL_DSN:-}" ] && listening 3306; then
	export MYSQL_DSN="root@tcp(127.0.0.1:3306)/test"
fi
echo "test.sh: SQL databases: SQLite${POSTGRES_DSN:+, PostgreSQL}${MYSQL_DSN:+, MariaDB/MySQL}" \
	"(${POSTGRES_DSN:-PostgreSQL skipped: nothing on 127.0.0.1:5432}; ${MYSQL_DSN:-MySQL skipped: nothing on 127.0.0.1:3306})"

unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "test.sh: gofmt needed on:"; echo "$unformatted"; exit 1
fi
go vet ./...
IDEMPOTENCY_REQUIRE_REDIS=1 go test -race -count=1 "$@" ./...
