#!/usr/bin/env bash
# Proves the README's test command on a bare machine: a fresh Debian
# bookworm root (debootstrap --variant=minbase: no C compiler, no
# redis-server, no chromium, no git, no databases) with only the Go
# toolchain copied in and a clone of this repository's HEAD.
#
#   sudo ./scripts/bare-machine.sh [DIR]     (DIR defaults to a new temp dir)
#
# Two steps, each timed:
#   1. setup, with the network: ./scripts/test.sh --setup installs with apt
#      what the tests need (git among them, for the release test), builds
#      the Debian trixie root that Redis 8.0 and Valkey 8.1 run from
#      (scripts/trixie.sh), and downloads every module's dependencies and
#      what tidying them reads;
#   2. test, under `unshare -n` (a network namespace with loopback only, so
#      nothing can reach a server outside): ./scripts/test.sh -v, exactly as
#      the README gives it.
# Needs root (debootstrap, chroot, unshare) and a network to Debian's mirrors
# and the Go module proxy. Locally added CA certificates of this machine
# (a TLS-intercepting proxy's) are copied into the root, since Go's downloads
# inside it go through the same proxy.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
root="${1:-$(mktemp -d /tmp/bare-machine.XXXXXX)}"
[ "$(id -u)" -eq 0 ] || { echo "bare-machine.sh: needs root (debootstrap, chroot, unshare)"; exit 1; }
say() { echo "bare-machine.sh: $*"; }
# step LABEL COMMAND… runs a long step, saying every 20 s that it still runs.
. "$repo/scripts/step.sh"

if ! command -v debootstrap >/dev/null; then
	say "installing debootstrap"
	step "apt-get update" apt-get update -qq
	step "apt-get install debootstrap" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
if [ ! -x "$root/bin/bash" ]; then
	say "debootstrap --variant=minbase bookworm $root"
	start=$SECONDS
	step debootstrap debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
	say "root built in $((SECONDS - start)) s"
fi

goroot="$(go env GOROOT)"
say "copying Go $(go env GOVERSION) from $goroot"
rm -rf "$root/usr/local/go"
cp -a "$goroot" "$root/usr/local/go"
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
	mkdir -p "$root/usr/local/share/ca-certificates"
	cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"

say "cloning $(git -C "$repo" rev-parse --short HEAD) into $root/src/idempotency"
rm -rf "$root/src/idempotency"
git clone -q --no-local "$repo" "$root/src/idempotency"

mounted=()
mnt() { mount "$@" && mounted=("${@: -1}" "${mounted[@]}"); }
cleanup() { for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done; }
trap cleanup EXIT
mnt -t proc proc "$root/proc"
mnt --rbind /dev "$root/dev"
# Without this, the mounts below would also cover the host's /dev/shm (and
# unmounting them the host's /dev/pts) on a host with shared propagation.
mount --make-rslave "$root/dev"
mnt -t tmpfs tmpfs "$root/dev/shm"
mnt -t sysfs sysfs "$root/sys"

# A login-like environment with nothing of this machine's: no GOFLAGS, no
# GOPATH, no tools on PATH but Debian's and Go's.
inside() {
	chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
		PATH=/usr/local/go/bin:/root/go/bin:/usr/sbin:/usr/bin:/sbin:/bin GOTOOLCHAIN=local \
		/bin/bash -c "cd /src/idempotency && $1"
}

say "step 1: ./scripts/test.sh --setup (with the network)"
start=$SECONDS
inside "./scripts/test.sh --setup"
setup=$((SECONDS - start))

say "step 2: ./scripts/test.sh -v under unshare -n (loopback only)"
start=$SECONDS
status=0
unshare -n bash -c "ip link set lo up && $(declare -f inside); root='$root'; inside 'GOPROXY=off ./scripts/test.sh -v'" |
	tee "$root/test.log" || status=$?
took=$((SECONDS - start))

say "setup took ${setup} s; the test command took ${took} s and exited ${status}"
say "package times:"
grep -E '^(✓|✗) ' "$root/test.log" | sed 's/^/  /' || true
exit "$status"
