package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// github.com/repenguin22/idemlease itself joins the side-by-side when
// -idemlease (by default $IDEMLEASE_DIR) names an extracted tree of it:
// the module proxy does not serve idemlease, so no go.mod of this
// repository may require it, or go mod tidy and go vet would fail where
// the tree is not. Its server, bench/peers/idemlease/main.go, is an
// `ignore` file of the bench module, built here as a module of its own
// that replaces idemlease and its redistore with the tree and this
// repository's modules with their directories; the copy of the file
// there has no build constraint.

// idemleaseVersion is the release of idemlease and of its redistore the
// server is written for; the tree is taken to be that release.
const idemleaseVersion = "v1.1.0"

var idemleaseKind = kind{
	Name: "idemlease", Title: "idemlease",
	What: "github.com/repenguin22/idemlease " + idemleaseVersion + " itself: httpidem.New(redistore.New(rdb), Require(true)), " +
		"redistore " + idemleaseVersion + ", every other option at its default (a 30 s lease, never renewed; records kept 24 h; " +
		"a SHA-256 fingerprint of method, path, query and body; 409 while a key runs; fail-closed); " +
		"go-redis PoolSize 64, ContextTimeoutEnabled",
	Package:   "github.com/onceonly/idempotency/bench/peers/idemlease",
	UsesRedis: true,
	Replay: func(resp *http.Response, body, first []byte) bool {
		return resp.Header.Get("Idempotency-Replayed") == "true" && string(body) == string(first)
	},
	ReplayHeader: "Idempotency-Replayed",
	source:       "peers/idemlease/main.go",
	stores:       []string{"redistore"},
	pins:         []string{"github.com/redis/go-redis/v9"},
}

// withIdemlease puts idemlease among the kinds, after the floor, when tree
// is an idemlease tree with its redistore.
func withIdemlease(ks []kind, tree string) ([]kind, error) {
	k, err := inTree(idemleaseKind, tree)
	if err != nil {
		return nil, err
	}
	at := slices.IndexFunc(ks, func(k kind) bool { return k.Name == "floor" }) + 1
	return slices.Insert(slices.Clone(ks), at, k), nil
}

// inTree is k built from tree, once tree is found to hold idemlease and
// the stores k needs, each a module in its folder.
func inTree(k kind, tree string) (kind, error) {
	tree, err := filepath.Abs(tree)
	if err != nil {
		return k, err
	}
	dirs := map[string]string{tree: idemleaseModule}
	for _, store := range k.stores {
		dirs[filepath.Join(tree, store)] = idemleaseModule + "/" + store
	}
	for dir, module := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil || !strings.HasPrefix(strings.TrimSpace(string(data)), "module "+module+"\n") {
			return k, fmt.Errorf("-idemlease %s: %s/go.mod is not module %s", tree, dir, module)
		}
	}
	k.tree = tree
	return k, nil
}

const idemleaseModule = "github.com/repenguin22/idemlease"

// buildIdemlease builds k's server into dir: a module in a directory of
// its own that holds a copy of its source and requires idemlease and its
// stores (redistore or pgstore) at idemleaseVersion (replaced with k.tree
// and its folders), the clients k.pins names (go-redis, pgx) at the bench
// module's versions and the bench module (for bench/peers/peer),
// every module of this repository replaced with its directory; go mod
// tidy completes it (with the proxy, for what idemlease requires), and go
// build builds it.
func buildIdemlease(ctx context.Context, dir string, k kind) error {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Path}}\t{{.Dir}}").Output()
	if err != nil {
		return fmt.Errorf("go list -m: %w", err)
	}
	modules := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		if path, d, ok := strings.Cut(line, "\t"); ok {
			modules[path] = d
		}
	}
	const benchModule = "github.com/onceonly/idempotency/bench"
	benchDir, ok := modules[benchModule]
	if !ok {
		return fmt.Errorf("go list -m does not list %s: run from the repository", benchModule)
	}
	var bench struct {
		Go      string
		Require []struct{ Path, Version string }
	}
	if out, err = exec.CommandContext(ctx, "go", "mod", "edit", "-json", filepath.Join(benchDir, "go.mod")).Output(); err != nil {
		return fmt.Errorf("go mod edit -json: %w", err)
	}
	if err := json.Unmarshal(out, &bench); err != nil {
		return err
	}
	pinned := map[string]string{}
	for _, r := range bench.Require {
		if slices.Contains(k.pins, r.Path) {
			pinned[r.Path] = r.Version
		}
	}
	for _, pin := range k.pins {
		if pinned[pin] == "" {
			return fmt.Errorf("%s/go.mod does not require %s", benchDir, pin)
		}
	}

	src := filepath.Join(dir, k.Name+"-module")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return err
	}
	code, err := os.ReadFile(filepath.Join(benchDir, k.source))
	if err != nil {
		return err
	}
	// The copy drops the constraint that keeps the file out of the bench
	// module's builds: go mod tidy never reads an `ignore` file, and
	// -tags ignore would build the generators of the standard library.
	code, ok = bytes.CutPrefix(code, []byte("//go:build ignore\n"))
	if !ok {
		return fmt.Errorf("%s does not begin with //go:build ignore", k.source)
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), code, 0o644); err != nil {
		return err
	}
	var mod strings.Builder
	fmt.Fprintf(&mod, "module sidebyside.example/%s\n\ngo %s\n\nrequire (\n", k.Name, bench.Go)
	fmt.Fprintf(&mod, "\t%s v0.0.0-00010101000000-000000000000\n", benchModule)
	for _, pin := range k.pins {
		fmt.Fprintf(&mod, "\t%s %s\n", pin, pinned[pin])
	}
	fmt.Fprintf(&mod, "\t%s %s\n", idemleaseModule, idemleaseVersion)
	for _, store := range k.stores {
		fmt.Fprintf(&mod, "\t%s/%s %s\n", idemleaseModule, store, idemleaseVersion)
	}
	mod.WriteString(")\n\nreplace (\n")
	fmt.Fprintf(&mod, "\t%s => %s\n", idemleaseModule, k.tree)
	for _, store := range k.stores {
		fmt.Fprintf(&mod, "\t%s/%s => %s\n", idemleaseModule, store, filepath.Join(k.tree, store))
	}
	for _, path := range slices.Sorted(maps.Keys(modules)) {
		fmt.Fprintf(&mod, "\t%s => %s\n", path, modules[path])
	}
	mod.WriteString(")\n")
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte(mod.String()), 0o644); err != nil {
		return err
	}

	flags, err := exec.CommandContext(ctx, "go", "env", "GOFLAGS").Output()
	if err != nil {
		return fmt.Errorf("go env GOFLAGS: %w", err)
	}
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS="+strings.TrimSpace(strings.TrimSpace(string(flags))+" -mod=mod"))
	for _, args := range [][]string{
		{"mod", "tidy"},
		{"build", "-o", k.binary(dir), "."},
	} {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir, cmd.Env = src, env
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s: go %s: %w", k.Name, strings.Join(args, " "), err)
		}
	}
	return nil
}
