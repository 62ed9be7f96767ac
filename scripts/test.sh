#!/usr/bin/env bash
# Runs every test of every module against real servers. On a bare Debian
# machine with only Go it installs what the tests need (CA certificates, a C
# toolchain for -race, redis-server, chromium) with apt-get, in one update,
# and says so. Then gofmt, go mod tidy -diff and go vet over every module,
# and go test -race, printing each package as it starts and ends.
#
# The tests start their own private redis-server processes (one per test
# package, plus a 3-master Redis Cluster) on free loopback ports and stop
# them when they finish; IDEMPOTENCY_REQUIRE_REDIS=1 makes a test fail
# instead of skipping when it finds no Redis. REDIS_URL or
# REDIS_CLUSTER_ADDRS, when set, point the tests at servers of your own
# instead; they only delete the keys they wrote. Arguments are passed to
# go test (-v, -run …); --setup alone installs and downloads everything the
# tests need and stops there, so that the tests can then run offline.
set -euo pipefail
cd "$(dirname "$0")/.."
setup_only=""
if [ "${1:-}" = "--setup" ]; then
	setup_only=1
	shift
fi

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

# SQL helpers run on SQLite always, and on PostgreSQL and MariaDB/MySQL
# through these DSNs (the defaults are this project's CI databases on
# loopback). The tests decide by connecting: when a database does not accept
# its DSN they skip with the server's answer. Set one empty to leave it out.
export POSTGRES_DSN="${POSTGRES_DSN-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
export MYSQL_DSN="${MYSQL_DSN-root@tcp(127.0.0.1:3306)/test}"
echo "test.sh: SQL tests on SQLite${POSTGRES_DSN:+, on PostgreSQL if it accepts POSTGRES_DSN}${MYSQL_DSN:+, on MariaDB/MySQL if it accepts MYSQL_DSN}"

# The repository is several modules tied by go.work; ./... would stop at
# the first module boundary, so every module is named.
modules=$(go list -m -f '{{.Dir}}')
patterns=$(for dir in $modules; do echo "./$(realpath --relative-to=. "$dir")/..."; done)
echo "test.sh: modules:" $(for dir in $modules; do realpath --relative-to=. "$dir"; done)
if [ -n "$setup_only" ]; then
	echo "test.sh: downloading every module's dependencies"
	go mod download
	# go mod tidy -diff also reads modules that only tests of dependencies
	# import; running it here fetches those too.
	for dir in $modules; do (cd "$dir" && go mod download && go mod tidy -diff >/dev/null); done
	echo "test.sh: set up; run ./scripts/test.sh to test"
	exit 0
fi

echo "test.sh: gofmt, go mod tidy -diff, go vet"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "test.sh: gofmt needed on:"; echo "$unformatted"; exit 1
fi
for dir in $modules; do
	(cd "$dir" && go mod tidy -diff) || { echo "test.sh: go mod tidy needed in $dir"; exit 1; }
done
go vet $patterns

# testprogress prints each package as it starts and ends, every failure's
# output, and what is still building or running whenever it has been quiet.
go build -buildvcs=false -o "${TMPDIR:-/tmp}/idempotency-testprogress" ./internal/testprogress
verbose=""
for arg in "$@"; do [ "$arg" = "-v" ] && verbose="-v"; done
echo "test.sh: go test -race $* (a cold -race build takes minutes; progress below)"
IDEMPOTENCY_REQUIRE_REDIS=1 go test -race -count=1 -json "$@" $patterns 2>&1 |
	"${TMPDIR:-/tmp}/idempotency-testprogress" $verbose
