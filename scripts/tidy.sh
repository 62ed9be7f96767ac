#!/usr/bin/env bash
# go mod tidy for every module of the workspace, as if each stood alone.
#
#   ./scripts/tidy.sh        check: print what tidy would change, exit 1 if anything
#   ./scripts/tidy.sh -w     write the tidied go.mod and go.sum files
#
# Each module requires its siblings at a released version (the last one, or
# the next before the first), which the proxy does not hold for the code in
# this tree; go.work ties them for development, but go mod tidy ignores
# go.work. So each module is tidied with GOWORK=off on copies of its go.mod
# and go.sum (-modfile) that replace every sibling with its directory: tidy
# then reads the siblings' code and requirements from the tree, adds a
# requirement that is missing (a sibling at v0.0.0-00010101000000-000000000000,
# which the check then shows) and drops one no longer imported. The
# replacements are taken out again before the copies are compared with the
# originals. go.sum lines for the siblings themselves are left out of the
# comparison: they hold the hashes of the released versions, which
# scripts/release.sh writes. Prints each module as it goes.
set -euo pipefail
cd "$(dirname "$0")/.."
write=""
[ "${1:-}" = "-w" ] && write=1
own=github.com/onceonly/idempotency

mapfile -t paths < <(go list -m -f '{{.Path}}')
mapfile -t dirs < <(go list -m -f '{{.Dir}}')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ownlines() { grep -E "^$own(/| )" "$1" 2>/dev/null || true; }
otherlines() { grep -vE "^$own(/| )" "$1" 2>/dev/null || true; }

status=0
n=${#paths[@]}
for i in "${!paths[@]}"; do
	path=${paths[$i]} dir=${dirs[$i]}
	name=$(realpath --relative-to=. "$dir")
	start=$SECONDS
	mod="$tmp/$i/go.mod" sum="$tmp/$i/go.sum"
	mkdir -p "$tmp/$i"
	cp "$dir/go.mod" "$mod"
	otherlines "$dir/go.sum" >"$sum"
	replace=() drop=()
	for j in "${!paths[@]}"; do
		[ "$j" = "$i" ] && continue
		replace+=("-replace=${paths[$j]}=${dirs[$j]}")
		drop+=("-dropreplace=${paths[$j]}")
	done
	go mod edit -modfile="$mod" "${replace[@]}"
	if ! (cd "$dir" && GOWORK=off go mod tidy -modfile="$mod"); then
		echo "tidy.sh: go mod tidy failed in $name"
		status=1
		continue
	fi
	go mod edit -modfile="$mod" "${drop[@]}"
	[ -s "$sum" ] || rm -f "$sum"
	if [ -n "$write" ]; then
		cp "$mod" "$dir/go.mod"
		if [ -f "$sum" ] || [ -n "$(ownlines "$dir/go.sum")" ]; then
			{ cat "$sum" 2>/dev/null || true; ownlines "$dir/go.sum"; } | LC_ALL=C sort -s -k1,1 >"$tmp/merged"
			mv "$tmp/merged" "$dir/go.sum"
		else
			rm -f "$dir/go.sum"
		fi
		echo "tidy.sh: $name tidied ($((i + 1))/$n, $((SECONDS - start)) s)"
		continue
	fi
	if diff -u --label "$name/go.mod" --label "$name/go.mod (tidy)" "$dir/go.mod" "$mod" &&
		diff -u --label "$name/go.sum" --label "$name/go.sum (tidy)" <(otherlines "$dir/go.sum") <(cat "$sum" 2>/dev/null || true); then
		echo "tidy.sh: $name is tidy ($((i + 1))/$n, $((SECONDS - start)) s)"
	else
		echo "tidy.sh: $name needs ./scripts/tidy.sh -w (the diff above)"
		status=1
	fi
done

# Every module requires its siblings at one version, the one go.work
# replaces with the tree: never the placeholder tidy adds for a missing one.
versions=$(grep -hE "^[[:space:]]*(require[[:space:]]+)?$own(/[^ ]*)? v" "${dirs[@]/%//go.mod}" | awk '{print $(NF-0) == "indirect" ? $(NF-2) : $NF}' | sort -u)
if [ "$(echo "$versions" | wc -l)" -ne 1 ] || [[ "$versions" == v0.0.0-* ]]; then
	echo "tidy.sh: the modules require each other at more than one version, or at none released:" $versions
	status=1
fi
exit "$status"
