#!/usr/bin/env bash
# Runs every test of every module against real servers. On a bare Debian
# machine with only Go it installs what the tests need (CA certificates,
# git, a C toolchain for -race, redis-server, redis-sentinel, chromium) with
# apt-get, in one update, and says so (scripts/trixie.sh adds debootstrap
# when it has a root to build, below). Then gofmt, scripts/tidy.sh and go
# vet over every module, each module printed as it goes, and go test -race,
# printing each package as it starts and ends. Every step that can take long
# (an apt-get, the trixie root, a vet) says every 20 s that it still runs,
# so the output never stops for 30 s. It ends with a summary of every server
# the tests can use (Redis 7, Redis 8, Valkey, Cluster, Sentinel,
# PostgreSQL, MariaDB, NATS, Chromium): its version, and whether this run
# used or skipped it, and why.
#
# The tests start their own private redis-server processes (one per test
# package, plus a 3-master Redis Cluster and a Sentinel set) on free
# loopback ports and stop them when they finish; IDEMPOTENCY_REQUIRE_REDIS=1
# makes a test fail instead of skipping when it finds no Redis. REDIS_URL or
# REDIS_CLUSTER_ADDRS, when set, point the tests at servers of your own
# instead; they only delete the keys they wrote. Arguments are passed to
# go test (-v, -run …); --setup alone installs and downloads everything the
# tests need and stops there, so that the tests can then run offline.
#
# The server matrix: REDIS_SERVERS (default redis7,redis8,valkey8) names
# the servers to test on. redis7 is Debian stable's redis-server, and runs
# every module's tests. redis8 and valkey8 are Redis 8.0 and Valkey 8.1 from
# Debian trixie, which do not install on bookworm: scripts/trixie.sh builds
# a minimal trixie root once (debootstrap, then apt-get inside it), cached
# in ${XDG_CACHE_HOME:-$HOME/.cache}/idempotency/trixie, and the root
# package's tests (Redis, Cluster, Sentinel) run on each, without -race,
# through IDEMPOTENCY_REDIS_SERVER. When Debian's archive cannot be reached
# to build the root, those two are skipped with a note; under CI=true, or
# with IDEMPOTENCY_REQUIRE_SERVERS=1, that is a failure instead.
set -euo pipefail
cd "$(dirname "$0")/.."
setup_only=""
if [ "${1:-}" = "--setup" ]; then
	setup_only=1
	shift
fi

# step LABEL COMMAND… runs a long step, saying every 20 s that it still runs.
. scripts/step.sh

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
updated=""
apt_install() { # apt_install WHY PACKAGE…: one apt-get update per run
	echo "test.sh: $1; installing $(echo "${@:2}") with apt-get"
	if [ -z "$updated" ]; then
		step "apt-get update" $sudo apt-get update -qq
		echo "test.sh: apt-get update done"
		updated=1
	fi
	# RUNLEVEL=1: installing redis-server must not start a system-wide
	# server; the tests start their own.
	step "apt-get install $(echo "${@:2}")" \
		env RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${@:2}" >/dev/null
	echo "test.sh: installed $(echo "${@:2}")"
}

# Go fetches modules over TLS, and a minimal Debian has no CA certificates.
if [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then
	apt_install "no CA certificates (go needs them to download modules)" ca-certificates
fi
# The release test (internal/release) tags a copy of the tree with git.
if ! command -v git >/dev/null; then
	apt_install "git not found (the release test tags a copy of the tree)" git
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
# The Sentinel failover test runs three redis-sentinel processes.
if ! command -v redis-sentinel >/dev/null; then
	apt_install "redis-sentinel not found (the Sentinel failover test runs three)" redis-sentinel
fi

# Which servers to test on.
servers="${REDIS_SERVERS:-redis7,redis8,valkey8}"
require_servers="${IDEMPOTENCY_REQUIRE_SERVERS:-}"
[ "${CI:-}" = true ] && require_servers=1
on() { case ",$servers," in *",$1,"*) return 0 ;; esac; return 1; }
for name in ${servers//,/ }; do
	case "$name" in redis7 | redis8 | valkey8) ;; *)
		echo "test.sh: REDIS_SERVERS: unknown server $name (redis7, redis8, valkey8)"; exit 2 ;;
	esac
done
echo "test.sh: servers: $servers"

# The browser tests (e2e/) drive Debian's chromium, headless; with
# IDEMPOTENCY_REQUIRE_BROWSER=1 they fail instead of skipping without it.
if ! command -v chromium >/dev/null; then
	apt_install "chromium not found" chromium
fi
chromium_version=$(chromium --version 2>/dev/null || echo "chromium (no version)")
echo "test.sh: $chromium_version"
export IDEMPOTENCY_REQUIRE_BROWSER=1

# SQL helpers run on SQLite always, and on PostgreSQL and MariaDB/MySQL
# through these DSNs (the defaults are this project's CI databases on
# loopback). The tests decide by connecting: when a database does not accept
# its DSN they skip with the server's answer. Set one empty to leave it out.
export POSTGRES_DSN="${POSTGRES_DSN-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
export MYSQL_DSN="${MYSQL_DSN-root@tcp(127.0.0.1:3306)/test}"
echo "test.sh: SQL tests on SQLite${POSTGRES_DSN:+, on PostgreSQL if it accepts POSTGRES_DSN}${MYSQL_DSN:+, on MariaDB/MySQL if it accepts MYSQL_DSN}"

# Redis 8.0 and Valkey 8.1 come from Debian trixie, whose packages need a
# newer C library than bookworm's: scripts/trixie.sh builds a minimal
# trixie root once (cached) and prints where its two server wrappers are.
trixie_bin=""
trixie_note=""
if on redis8 || on valkey8; then
	trixie_status=0
	trixie_bin=$(step "trixie root (scripts/trixie.sh)" ./scripts/trixie.sh) || trixie_status=$?
	case "$trixie_status" in
	0) ;;
	3)
		trixie_note="Debian's archive could not be reached to build the trixie root (scripts/trixie.sh said so above)"
		if [ -n "$require_servers" ]; then
			echo "test.sh: $trixie_note; Redis 8.0 and Valkey 8.1 are required here (CI=true or IDEMPOTENCY_REQUIRE_SERVERS=1)"
			exit 1
		fi
		echo "test.sh: $trixie_note; Redis 8.0 and Valkey 8.1 will be skipped"
		;;
	*) exit 1 ;;
	esac
fi

# The repository is several modules tied by go.work; ./... would stop at
# the first module boundary, so every module is named.
modules=$(go list -m -f '{{.Dir}}')
patterns=$(for dir in $modules; do
	rel=$(realpath --relative-to=. "$dir")
	if [ "$rel" = . ]; then echo "./..."; else echo "./$rel/..."; fi
done)
echo "test.sh: modules:" $(for dir in $modules; do realpath --relative-to=. "$dir"; done)
# The release test builds, offline, a program that requires the root module
# alone, and lists its modules (go list -m all): the module cache must hold
# the version information (.info) of every module in that graph, which a
# build fetches only for the modules whose packages it compiles (go-redis's
# and redislock's own requirements are not). Listing the root module's graph
# here fetches it once; offline, with the cache complete, it is a no-op.
if ! step "go list -m all" env GOWORK=off go list -m all >/dev/null 2>&1; then
	echo "test.sh: could not list the root module's graph (offline with an incomplete module cache?); the release test will say what is missing"
fi
if [ -n "$setup_only" ]; then
	echo "test.sh: downloading every module's dependencies"
	for dir in $modules; do
		echo "test.sh: go mod download: $(realpath --relative-to=. "$dir")"
		(cd "$dir" && step "go mod download" go mod download)
	done
	# Tidying also reads modules that only tests of dependencies import;
	# running it here fetches those too.
	echo "test.sh: scripts/tidy.sh, for the modules only tests of dependencies import"
	step tidy ./scripts/tidy.sh >/dev/null || true
	echo "test.sh: set up; run ./scripts/test.sh to test"
	exit 0
fi

checks_start=$SECONDS
echo "test.sh: gofmt -l ."
unformatted=$(step gofmt gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "test.sh: gofmt needed on:"; echo "$unformatted"; exit 1
fi
echo "test.sh: gofmt: every file formatted ($((SECONDS - checks_start)) s)"
echo "test.sh: tidy: every module's go.mod and go.sum (scripts/tidy.sh)"
step tidy ./scripts/tidy.sh 2>&1 | sed -u 's/^tidy.sh: /test.sh: tidy: /' ||
	{ echo "test.sh: go mod tidy needed: ./scripts/tidy.sh -w"; exit 1; }
i=0
count=$(echo "$modules" | wc -w)
for dir in $modules; do
	i=$((i + 1))
	name=$(realpath --relative-to=. "$dir")
	start=$SECONDS
	echo "test.sh: vet: $name ($i/$count)"
	(cd "$dir" && step "vet $name" go vet ./...) || { echo "test.sh: go vet failed in $name"; exit 1; }
	echo "test.sh: vet: $name passed in $((SECONDS - start)) s"
done
echo "test.sh: gofmt, tidy and vet took $((SECONDS - checks_start)) s"

# testprogress prints each package as it starts and ends, every failure's
# output, and what is still building or running whenever it has been quiet;
# serverversion starts a server and prints what its INFO server says.
bin="${TMPDIR:-/tmp}"
echo "test.sh: building internal/testprogress and internal/serverversion"
step "go build" go build -buildvcs=false -o "$bin/idempotency-testprogress" ./internal/testprogress
step "go build" go build -buildvcs=false -o "$bin/idempotency-serverversion" ./internal/serverversion
verbose=""
for arg in "$@"; do [ "$arg" = "-v" ] && verbose="-v"; done

resultdir=$(mktemp -d)
trap 'rm -rf "$resultdir"' EXIT
# pass NAME SERVER-PROGRAM GO-TEST-ARGS…: one go test run on one server,
# whose verdict goes to $resultdir/NAME for the summary.
pass() {
	local name=$1 program=$2 version start=$SECONDS
	shift 2
	if ! version=$(IDEMPOTENCY_REDIS_SERVER="$program" "$bin/idempotency-serverversion"); then
		echo "$name: $program did not start" >"$resultdir/$name"
		return 1
	fi
	echo "$version" >"$resultdir/$name.version"
	echo "test.sh: $name: $version; go test $*"
	# The events are kept for the summary: which tests ran, and on what.
	# -timeout 30m, not go test's 10 minutes a package: on a machine busy
	# with other work, internal/release (which builds every module from a
	# copy of the tree) can need more; a hung test still ends the run.
	if IDEMPOTENCY_REQUIRE_REDIS=1 IDEMPOTENCY_REDIS_SERVER="$program" go test -count=1 -timeout 30m -json "$@" 2>&1 |
		tee "$resultdir/$name.json" | "$bin/idempotency-testprogress" $verbose; then
		echo "$name ($version): passed in $((SECONDS - start)) s" >"$resultdir/$name"
	else
		echo "$name ($version): FAILED after $((SECONDS - start)) s" >"$resultdir/$name"
		return 1
	fi
}

status=0
if on redis7; then
	echo "test.sh: every module on Debian stable's $(redis-server --version | cut -d' ' -f1-3), with -race (a cold -race build takes minutes; progress below)"
	pass redis7 redis-server -race "$@" $patterns || status=1
fi
# The other servers run the root package's tests and the fault checker on
# Redis only: those are the ones that talk to Redis in every way the
# library does (scripts, the lock, WAIT, the cluster, Sentinel, faults);
# -race adds nothing a server could change.
# The two run side by side, each line marked with its server: the root
# package's tests mostly wait (leases, timeouts, a failover), so two runs
# take hardly longer than one. Only servers this run starts: REDIS_URL and
# REDIS_CLUSTER_ADDRS would point the tests elsewhere.
pids=()
matrix_start=$SECONDS
for name in redis8 valkey8; do
	on "$name" || continue
	if [ -z "$trixie_bin" ]; then
		echo "$name: skipped: $trixie_note" >"$resultdir/$name"
		continue
	fi
	(REDIS_URL="" REDIS_CLUSTER_ADDRS="" pass "$name" "$trixie_bin/$name-server" "$@" -skip '^TestFaultCheck(Steps)?SQL$' . ./internal/faultcheck 2>&1 | sed -u "s/^/[$name] /") &
	pids+=("$!")
done
for pid in "${pids[@]}"; do
	wait "$pid" || status=1
done
[ "${#pids[@]}" -eq 0 ] || echo "test.sh: Redis 8.0 and Valkey 8.1 took $((SECONDS - matrix_start)) s side by side"
# The summary: every server the tests can use, with its version, and
# whether this run used it, from the go test events each run kept.
module=github.com/onceonly/idempotency
# ran TEST [PACKAGE [bare]]: how TEST (or, without one, PACKAGE) ended on
# each server: "passed on redis7 (…)", "skipped on … (why)", or "not run";
# with bare, without the server, for what does not depend on it. A
# test whose subtests all skipped counts as skipped, although go test says
# it passed.
ran() {
	local test=$1 pkg=${2:-$module} bare=${3:-} out="" name events actions word why where
	for name in redis7 redis8 valkey8; do
		[ -f "$resultdir/$name.json" ] || continue
		if [ -n "$test" ]; then
			events=$(grep -F "\"Package\":\"$pkg\",\"Test\":\"$test" "$resultdir/$name.json" |
				grep -E "\"Test\":\"$test(/[^\"]*)?\"" || true)
		else
			events=$(grep -F "\"Package\":\"$pkg\",\"Elapsed\"" "$resultdir/$name.json" || true)
		fi
		actions=$(echo "$events" | grep -o '"Action":"[a-z]*"' | cut -d'"' -f4 | sort -u | tr '\n' ' ')
		why=""
		case " $actions " in
		*" fail "*) word=FAILED ;;
		*" skip "*)
			word=skipped
			# Passed subtests beside skipped ones: it ran.
			if [ -n "$test" ] && echo "$events" | grep -q "\"Action\":\"pass\",\"Package\":\"$pkg\",\"Test\":\"$test/"; then
				word=passed
			else
				why=$(echo "$events" | grep -o '"Output":"    [^"]*skip[^"]*' | head -1 |
					sed 's/^"Output":" *[a-z_]*\.go:[0-9]*: //; s/\\n$//')
			fi
			;;
		*" pass "*) word=passed ;;
		*) continue ;;
		esac
		where=" on $name ($(cat "$resultdir/$name.version"))"
		[ -z "$bare" ] || where=""
		out="$out${out:+; }$word$where${why:+: $why}"
	done
	echo "${out:-not run}"
}
# sqlserver KIND VAR: the SQL server the tests used, or why they skipped it.
sqlserver() {
	local used skipped
	used=$(cat "$resultdir"/*.json 2>/dev/null | grep -o "sqltest: $1 server: [^\\\"]*" | head -1 | sed "s/^sqltest: $1 server: //; s/ on .*//")
	skipped=$(cat "$resultdir"/*.json 2>/dev/null | grep -o "$2 \(is not set\|does not accept\)[^\\]*" | head -1)
	if [ -n "$used" ]; then echo "$used: used"; elif [ -n "$skipped" ]; then echo "skipped: $skipped"; else echo "not run"; fi
}
nats_version=$(go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2 2>/dev/null || echo "(version unknown)")
echo "test.sh: summary of the servers:"
for name in redis7 redis8 valkey8; do
	label=$(case $name in redis7) echo "Redis 7" ;; redis8) echo "Redis 8" ;; valkey8) echo "Valkey" ;; esac)
	if [ -f "$resultdir/$name" ]; then
		echo "  $label: $(cat "$resultdir/$name")"
	else
		echo "  $label: skipped: not in REDIS_SERVERS ($servers)"
	fi
done
echo "  Cluster (3 masters, TestRedisCluster): $(ran TestRedisCluster)"
echo "  Sentinel (TestSentinelFailover): $(ran TestSentinelFailover)"
echo "  Fault checker on SQL (TestFaultCheckSQL): $(ran TestFaultCheckSQL $module/internal/faultcheck)"
echo "  Steps fault checker on SQL (TestFaultCheckStepsSQL): $(ran TestFaultCheckStepsSQL $module/internal/faultcheck)"
echo "  PostgreSQL: $(sqlserver postgres POSTGRES_DSN)"
echo "  MariaDB/MySQL: $(sqlserver mysql MYSQL_DSN)"
echo "  NATS JetStream (embedded nats-server $nats_version, example/relay): $(ran "" $module/example/relay bare)"
echo "  Chromium ($chromium_version, e2e): $(ran "" $module/e2e bare)"
# What failed, again, last: a long log's reader may see only its tail.
for name in redis7 redis8 valkey8; do
	[ -f "$resultdir/$name.json" ] || continue
	case $(cat "$resultdir/$name") in *FAILED*) ;; *) continue ;; esac
	echo "test.sh: what failed on $name:"
	"$bin/idempotency-testprogress" -recap <"$resultdir/$name.json" | sed "s/^/  /"
done
exit "$status"
