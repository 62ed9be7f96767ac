# Sourced by the scripts that run long steps (test.sh, bare-machine.sh).
#
# step LABEL COMMAND…: runs COMMAND, and every 20 s while it runs says so
# (on the script's own standard output, which a $(step …) does not
# capture), so that the output never stops for 30 s.
exec 3>&1
step() {
	local label=$1 start=$SECONDS status=0 ticker
	shift
	(
		trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
		while true; do
			sleep 20 &
			sleeper=$!
			wait "$sleeper"
			echo "${0##*/}: $label: still running ($((SECONDS - start)) s)" >&3
		done
	) &
	ticker=$!
	"$@" || status=$?
	kill "$ticker" 2>/dev/null
	wait "$ticker" 2>/dev/null || true
	return "$status"
}
