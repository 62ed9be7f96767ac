#!/usr/bin/env bash
# Regenerates the benchmark figures, on loopback only:
#  1. go test benchmarks against a private redis-server (bench/gobench.txt);
#  2. the load driver (bench/results.json) and its chart: docs/bench.svg and
#     the tables between the bench markers of docs/benchmarks.md and of
#     README.md, where they have them;
#  3. the side-by-side run: this library, the floor (the fewest Redis
#     commands its guarantees allow), Fiber's idempotency middleware and bare
#     net/http under wrk, in one run against one private redis-server
#     (bench/sidebyside.json, the section between the sidebyside markers of
#     docs/benchmarks.md, and the short table between the
#     sidebyside-summary markers of README.md). IDEMLEASE_DIR, when set,
#     names an extracted tree of github.com/repenguin22/idemlease v1.1.0
#     (its redistore at redistore/v1.1.0 in redistore/), which the module
#     proxy does not serve; it is passed on as -idemlease, and the run
#     measures idemlease itself too (bench/peers/idemlease). Unset, the
#     run leaves idemlease out and says so. From a clone of idemlease:
#       mkdir -p /tmp/idemlease && git -C idemlease archive v1.1.0 | tar -x -C /tmp/idemlease
#       rm -rf /tmp/idemlease/redistore
#       git -C idemlease archive redistore/v1.1.0 redistore | tar -x -C /tmp/idemlease
#  4. the server matrix: this library alone on Redis 7.0, Redis 8.0 and
#     Valkey 8.1 (scripts/trixie.sh makes the last two ready), first
#     executions in one run (bench/servers.json, and the section between the
#     servers markers of docs/benchmarks.md). BENCH_SERVERS=0 leaves it out.
# Bounded: about 9 minutes in all (11 with idemlease). Every process it
# starts stops with it, on failure and on Ctrl-C too.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "bench.sh: install redis-server first (./scripts/test.sh does)"; exit 1; }
if ! command -v wrk >/dev/null; then
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	echo "bench.sh: wrk not found; installing it with apt-get"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq wrk >/dev/null
fi
mkdir -p docs

IDEMPOTENCY_REQUIRE_REDIS=1 go test -run '^$' -bench . -benchmem -benchtime 2s . | tee bench/gobench.txt
go run ./bench/load -duration "${LOAD_DURATION:-6s}" -conns 16 -out bench/results.json
for doc in docs/benchmarks.md README.md; do
	if [ -f "$doc" ] && grep -q '<!-- bench:begin -->' "$doc"; then
		go run ./bench/chart -in bench/results.json -gobench bench/gobench.txt -svg docs/bench.svg -readme "$doc"
		echo "bench.sh: $doc updated"
	fi
done

docs=()
if [ -f docs/benchmarks.md ] && grep -q '<!-- sidebyside:begin -->' docs/benchmarks.md; then
	docs=(-docs docs/benchmarks.md)
else
	echo "bench.sh: docs/benchmarks.md has no sidebyside markers; the side-by-side table goes to bench/sidebyside.json only"
fi
if grep -q '<!-- sidebyside-summary:begin -->' README.md; then
	docs+=(-readme README.md)
fi
idemlease=()
if [ -n "${IDEMLEASE_DIR:-}" ]; then
	idemlease=(-idemlease "$IDEMLEASE_DIR")
fi
go run ./bench/sidebyside -rounds 3 -duration 6s -warmup 2s -threads 1 -conns 16 -timeout 8m \
	-out bench/sidebyside.json "${docs[@]}" "${idemlease[@]}"
echo "bench.sh: docs/bench.svg, bench/results.json and bench/sidebyside.json updated"

if [ "${BENCH_SERVERS:-1}" != 0 ]; then
	trixie_bin=$(./scripts/trixie.sh)
	docs=()
	if grep -q '<!-- servers:begin -->' docs/benchmarks.md; then
		docs=(-docs docs/benchmarks.md)
	fi
	go run ./bench/sidebyside -server redis7,redis8,valkey8 -trixie "$trixie_bin" -rounds 5 -duration 6s \
		-warmup 2s -threads 1 -conns 16 -timeout 5m -out bench/servers.json "${docs[@]}"
	echo "bench.sh: bench/servers.json updated"
fi
