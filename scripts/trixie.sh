#!/usr/bin/env bash
# Makes Redis 8.0 and Valkey 8.1 runnable on this Debian bookworm machine,
# for the test command's server matrix and the benchmark's -server choice.
#
#   ./scripts/trixie.sh        prints the directory of the two wrappers
#
# Debian trixie packages both (redis-server, valkey-server), but they need a
# newer C library than bookworm's, so they do not install here directly.
# This script builds a minimal trixie root once (debootstrap --variant=
# minbase, then apt-get install inside it through chroot), cached in
# ${XDG_CACHE_HOME:-$HOME/.cache}/idempotency/trixie, and writes two
# wrappers beside it, bin/redis8-server and bin/valkey8-server, which run
# each server out of the root through the root's own dynamic loader and
# libraries: no chroot at run time, so no privileges, and every directory
# and file the tests hand the server is this machine's own. Each takes
# redis-server's command line (and --sentinel).
#
# Building needs root (it uses sudo otherwise) and Debian's archive
# (IDEMPOTENCY_DEBIAN_MIRROR, default http://deb.debian.org/debian); it is
# bounded (debootstrap 15 minutes, apt-get 10) and prints its stages.
# Exits 0 when the wrappers run; 3, with a note on stderr, when the archive
# cannot be reached; 1 on any other failure.
set -euo pipefail
say() { echo "trixie.sh: $*" >&2; }

cache="${XDG_CACHE_HOME:-$HOME/.cache}/idempotency"
root="$cache/trixie"
packages="redis-server valkey-server"
mirror="${IDEMPOTENCY_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

build() {
	if ! command -v debootstrap >/dev/null; then
		say "debootstrap not found; installing it with apt-get"
		$sudo apt-get update -qq
		DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq debootstrap >/dev/null
	fi
	mkdir -p "$cache"
	local log="$cache/trixie.log" new="$root.new" start=$SECONDS status=0
	say "building a Debian trixie root for Redis 8.0 and Valkey 8.1 in $root (once; about a minute; log in $log)"
	$sudo rm -rf "$new"
	# debootstrap prints lines per package; its stages are the lines that
	# end with "..." and name no package.
	set +e
	timeout 900 $sudo debootstrap --variant=minbase trixie "$new" "$mirror" 2>&1 | tee "$log" |
		awk '/^I: Retrieving / { if (++n % 25 == 0) { print "trixie.sh: " n " packages retrieved"; fflush() } }
			/^I: (Extracting|Retrieving|Validating) |^I: [A-Za-z]+ [^ ]+\.\.\.$/ { next }
			/\.\.\.$|successfully|^[EW]:/ { print "trixie.sh: " $0; fflush() }' >&2
	status=${PIPESTATUS[0]}
	set -e
	if [ "$status" -eq 0 ]; then
		say "installing $packages inside it"
		$sudo cp /etc/resolv.conf "$new/etc/resolv.conf"
		# Nothing inside the root may start a service.
		printf '#!/bin/sh\nexit 101\n' | $sudo tee "$new/usr/sbin/policy-rc.d" >/dev/null
		$sudo chmod +x "$new/usr/sbin/policy-rc.d"
		set +e
		timeout 600 $sudo chroot "$new" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
			DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 /bin/sh -c \
			"apt-get update -qq && apt-get install -y -qq --no-install-recommends $packages && apt-get clean" \
			>>"$log" 2>&1
		status=$?
		set -e
	fi
	if [ "$status" -ne 0 ]; then
		$sudo rm -rf "$new"
		if [ "$status" -eq 124 ]; then
			say "building the trixie root timed out: is Debian's archive at $mirror reachable? (see $log)"
			exit 3
		fi
		if grep -qE "Failed getting release file|Temporary failure resolving|Could not resolve|Failed to fetch|Connection refused|Network is unreachable|Unable to connect" "$log"; then
			say "Debian's archive at $mirror is unreachable, so no trixie root (see $log)"
			exit 3
		fi
		say "building the trixie root failed; the end of $log:"
		tail -20 "$log" >&2
		exit 1
	fi
	echo "$packages" | $sudo tee "$new/.idempotency-packages" >/dev/null
	$sudo rm -rf "$root"
	$sudo mv "$new" "$root"
	say "trixie root built in $((SECONDS - start)) s ($(du -sh "$root" | cut -f1))"
}

# wrapper NAME PROGRAM writes $cache/bin/NAME, which runs PROGRAM out of
# the root.
wrapper() {
	local loader
	loader=$(find "$root/usr/lib" -maxdepth 2 -name 'ld-linux*.so.*' | head -1)
	[ -n "$loader" ] || { say "no dynamic loader in $root"; exit 1; }
	mkdir -p "$cache/bin"
	cat >"$cache/bin/$1" <<-EOF
		#!/bin/sh
		# $2 from the Debian trixie root that scripts/trixie.sh built.
		lib='$(dirname "$loader")'
		exec "\$lib/$(basename "$loader")" --inhibit-cache --library-path "\$lib" \\
			--argv0 $2 '$root/usr/bin/$2' "\$@"
	EOF
	chmod +x "$cache/bin/$1"
	"$cache/bin/$1" --version >/dev/null || { say "$cache/bin/$1 does not run"; exit 1; }
}

# One build at a time: the test command and a benchmark may start together.
mkdir -p "$cache"
exec 9>"$cache/trixie.lock"
flock 9
if [ "$(cat "$root/.idempotency-packages" 2>/dev/null)" = "$packages" ]; then
	say "Debian trixie root for Redis 8.0 and Valkey 8.1: $root (cached)"
else
	build
fi
wrapper redis8-server redis-server
wrapper valkey8-server valkey-server
echo "$cache/bin"
