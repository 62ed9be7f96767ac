#!/usr/bin/env bash
# Regenerates the README's benchmark section and docs/bench.svg: go test
# benchmarks against a private redis-server, then the load driver on
# loopback, then the chart. Bounded: about 1 minute in all.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "bench.sh: install redis-server first (./scripts/test.sh does)"; exit 1; }
mkdir -p docs
IDEMPOTENCY_REQUIRE_REDIS=1 go test -run '^$' -bench . -benchmem -benchtime 2s . | tee bench/gobench.txt
go run ./bench/load -duration "${LOAD_DURATION:-6s}" -conns 16 -out bench/results.json
go run ./bench/chart -in bench/results.json -gobench bench/gobench.txt -svg docs/bench.svg -readme README.md
echo "bench.sh: README.md and docs/bench.svg updated"
