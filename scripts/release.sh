#!/usr/bin/env bash
# Releases every module of the repository at one version.
#
#   ./scripts/release.sh vX.Y.Z
#
# On a clean tree, it:
#   1. checks that every module is tidy (scripts/tidy.sh);
#   2. makes every module require its siblings at vX.Y.Z (go mod edit), and
#      go.work replace those requirements with the tree at vX.Y.Z;
#   3. writes the siblings' hashes at vX.Y.Z into each module's go.sum, from
#      module zips it makes of the tree (internal/release, which also leaves
#      them in a file:// proxy: the path is printed);
#   4. commits that ("Release vX.Y.Z: …"), and
#   5. tags the commit once per module, as the go command expects of a
#      module in a subdirectory: vX.Y.Z for the root, sqlidem/vX.Y.Z,
#      optimistic/vX.Y.Z, … for the others.
# It pushes nothing: it prints the git push that publishes the release.
# internal/release's TestRelease runs it on a copy of the tree and then
# fetches each module alone from a file:// proxy.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "release.sh: $*"; }
version="${1:-}"
if ! [[ "$version" =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$ ]]; then
	say "usage: scripts/release.sh vX.Y.Z"
	exit 2
fi
if [ "${BASH_REMATCH[1]}" -ge 2 ]; then
	say "$version: a major version 2 or above needs /v${BASH_REMATCH[1]} module paths first"
	exit 2
fi
if [ -n "$(git status --porcelain)" ]; then
	say "the tree has uncommitted changes; commit or stash them first"
	exit 1
fi

mapfile -t paths < <(go list -m -f '{{.Path}}')
mapfile -t dirs < <(go list -m -f '{{.Dir}}' | while read -r d; do realpath --relative-to=. "$d"; done)
tags=()
for dir in "${dirs[@]}"; do
	tag="$version"
	[ "$dir" = . ] || tag="$dir/$version"
	if git rev-parse -q --verify "refs/tags/$tag" >/dev/null; then
		say "tag $tag exists already"
		exit 1
	fi
	tags+=("$tag")
done

say "1/5 checking that every module is tidy"
./scripts/tidy.sh >/dev/null || { ./scripts/tidy.sh | grep -v ' is tidy'; exit 1; }

say "2/5 requiring the modules at $version"
own=github.com/onceonly/idempotency
for dir in "${dirs[@]}"; do
	edits=()
	for req in $(go mod edit -print "$dir/go.mod" | awk -v own="$own" '$1 == own || index($1, own "/") == 1 {print $1} $1 == "require" && ($2 == own || index($2, own "/") == 1) {print $2}'); do
		edits+=("-require=$req@$version")
	done
	[ "${#edits[@]}" -eq 0 ] || go mod edit "${edits[@]}" "$dir/go.mod"
done
# go.work's replacements, each moved to the new version.
sed -i -E "s#^([[:space:]]*(replace[[:space:]]+)?$own(/[^[:space:]]*)?) v[^[:space:]]+ => #\1 $version => #" go.work

proxy=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-release-$version.XXXXXX")
say "3/5 writing the siblings' hashes into go.sum (the modules go to file://$proxy)"
go run ./internal/release -version "$version" -proxy "$proxy" -sums >/dev/null

say "4/5 committing"
git add -A -- '*go.mod' '*go.sum' go.work
git commit -q -m "Release $version: the modules require each other at $version"

say "5/5 tagging $(git rev-parse --short HEAD)"
for tag in "${tags[@]}"; do
	git tag -a -m "$tag" "$tag"
done
say "tagged: ${tags[*]}"
say "publish with: git push origin HEAD ${tags[*]}"
