#!/usr/bin/env bash
# Mutation testing of the promises: each mutant of scripts/mutants/list.go
# is a one-line change that breaks one promise; each is applied to a copy
# of the tree (the working tree is never changed) and must be killed by
# the fault checker, aimed at the faults that can show it, or, where the
# list says why no interleaving can, by the unit tests that guard its line.
# Exits 1 when any survives. Flags (see scripts/mutants/main.go):
#   --list            the mutants, one a line: name, file, what it breaks
#   -n N -seed S      a random sample of N, drawn with seed S
#   -run REGEXP       the mutants whose names match
#   -duration D       the fault checker's time per mutant (default 90s)
#   -report FILE      also write the Markdown report to FILE
set -euo pipefail
cd "$(dirname "$0")/.."
# The SQL mutants' tests run on the databases the test command uses.
export POSTGRES_DSN="${POSTGRES_DSN-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
export MYSQL_DSN="${MYSQL_DSN-root@tcp(127.0.0.1:3306)/test}"
args=()
for a in "$@"; do
	case "$a" in
	--list) args+=(-list) ;;
	*) args+=("$a") ;;
	esac
done
exec go run ./scripts/mutants "${args[@]}"
