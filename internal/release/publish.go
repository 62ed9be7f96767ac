// Command release publishes the modules of this repository into a
// directory in GOPROXY layout (a file:// module proxy), each at one
// version, as the module proxy would serve them from the tags that
// scripts/release.sh makes:
//
//	go run ./internal/release -version v0.2.0 -proxy DIR [-rev REV] [-sums]
//
// The modules are those go.work uses. With -rev their files are the ones
// git holds at REV; without it, the working tree's files that git tracks or
// would track (ignored ones left out). With -sums (working tree only) each
// module's go.sum first gets the hashes of the sibling modules it requires,
// at the version, published before it: scripts/release.sh commits those.
//
// It is a module of its own so that golang.org/x/mod, which it needs to
// write module zips and hashes, never enters the root module's graph.
package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	"golang.org/x/mod/zip"
)

func main() {
	version := flag.String("version", "", "the version to publish at (vX.Y.Z)")
	proxy := flag.String("proxy", "", "the directory to write the modules into, in GOPROXY layout")
	rev := flag.String("rev", "", "publish the files git holds at this revision instead of the working tree")
	sums := flag.Bool("sums", false, "first write the siblings' hashes into each module's go.sum (working tree only)")
	repo := flag.String("repo", ".", "the repository's root directory")
	flag.Parse()
	if *version == "" || *proxy == "" || flag.NArg() > 0 || (*sums && *rev != "") {
		flag.Usage()
		os.Exit(2)
	}
	mods, err := publish(*repo, *rev, *version, *proxy, *sums)
	if err != nil {
		log.Fatalf("release: %v", err)
	}
	for _, m := range mods {
		fmt.Printf("release: published %s@%s\n", m.Path, *version)
	}
}

// A mod is one module of the workspace.
type mod struct {
	Path string   // module path
	Dir  string   // relative to the repository, "." for the root
	Deps []string // the paths of the sibling modules its go.mod requires
}

// publish writes every module of the repository at version into proxy, a
// module depending on its siblings after them, and returns them in that
// order.
func publish(repo, rev, version, proxy string, sums bool) ([]mod, error) {
	if !semverRelease(version) {
		return nil, fmt.Errorf("version %q is not vX.Y.Z", version)
	}
	tree, cleanup, err := checkout(repo, rev)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	mods, err := modules(tree)
	if err != nil {
		return nil, err
	}
	hashes := map[string][2]string{} // path → zip hash, go.mod hash
	for _, m := range mods {
		if sums {
			if err := writeSums(filepath.Join(tree, m.Dir, "go.sum"), m, version, hashes); err != nil {
				return nil, err
			}
			// The go.sum in the working tree is the one to commit.
			if err := copyFile(filepath.Join(tree, m.Dir, "go.sum"), filepath.Join(repo, m.Dir, "go.sum")); err != nil {
				return nil, err
			}
		}
		zipHash, modHash, err := write(proxy, tree, m, version)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.Path, err)
		}
		hashes[m.Path] = [2]string{zipHash, modHash}
	}
	return mods, nil
}

func semverRelease(v string) bool {
	parts := strings.Split(strings.TrimPrefix(v, "v"), ".")
	if !strings.HasPrefix(v, "v") || len(parts) != 3 {
		return false
	}
	for _, p := range parts {
		if p == "" || strings.Trim(p, "0123456789") != "" || (len(p) > 1 && p[0] == '0') {
			return false
		}
	}
	return true
}

// checkout copies the files of the repository (at rev, or those of the
// working tree git tracks or would track) into a new directory.
func checkout(repo, rev string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "release-tree-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	if rev != "" {
		archive := exec.Command("git", "-C", repo, "archive", "--format=tar", rev)
		untar := exec.Command("tar", "-x", "-C", dir)
		untar.Stdin, err = archive.StdoutPipe()
		if err == nil {
			archive.Stderr, untar.Stderr = os.Stderr, os.Stderr
			err = untar.Start()
		}
		if err == nil {
			err = errors.Join(archive.Run(), untar.Wait())
		}
		if err != nil {
			cleanup()
			return "", nil, fmt.Errorf("git archive %s: %w", rev, err)
		}
		return dir, cleanup, nil
	}
	out, err := exec.Command("git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("git ls-files: %w", err)
	}
	for name := range strings.SplitSeq(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		err := copyFile(filepath.Join(repo, name), filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue // tracked, but deleted in the working tree
		}
		if err != nil {
			cleanup()
			return "", nil, err
		}
	}
	return dir, cleanup, nil
}

func copyFile(from, to string) error {
	info, err := os.Lstat(from)
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return nil // module zips hold regular files only
	}
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, data, info.Mode().Perm())
}

// modules lists the modules go.work uses in tree, each after the siblings
// it requires.
func modules(tree string) ([]mod, error) {
	data, err := os.ReadFile(filepath.Join(tree, "go.work"))
	if err != nil {
		return nil, err
	}
	work, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	byPath := map[string]*mod{}
	var paths []string
	for _, use := range work.Use {
		dir := filepath.Clean(use.Path)
		data, err := os.ReadFile(filepath.Join(tree, dir, "go.mod"))
		if err != nil {
			return nil, err
		}
		f, err := modfile.ParseLax(filepath.Join(dir, "go.mod"), data, nil)
		if err != nil {
			return nil, err
		}
		m := &mod{Path: f.Module.Mod.Path, Dir: dir}
		for _, r := range f.Require {
			m.Deps = append(m.Deps, r.Mod.Path)
		}
		if len(f.Replace) > 0 {
			return nil, fmt.Errorf("%s/go.mod has a replace directive, which its users' builds would ignore", dir)
		}
		byPath[m.Path] = m
		paths = append(paths, m.Path)
	}
	for _, m := range byPath {
		m.Deps = slices.DeleteFunc(m.Deps, func(p string) bool { return byPath[p] == nil })
	}
	// Depth first, so that every module comes after what it requires.
	var order []mod
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(string) error
	visit = func(p string) error {
		switch state[p] {
		case 1:
			return fmt.Errorf("the modules require each other in a cycle through %s", p)
		case 2:
			return nil
		}
		state[p] = 1
		for _, d := range byPath[p].Deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		state[p] = 2
		order = append(order, *byPath[p])
		return nil
	}
	slices.Sort(paths)
	for _, p := range paths {
		if err := visit(p); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// writeSums replaces the go.sum lines of m's siblings with their hashes at
// version.
func writeSums(file string, m mod, version string, hashes map[string][2]string) error {
	data, err := os.ReadFile(file)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	siblings := map[string]bool{}
	for _, d := range m.Deps {
		siblings[d] = true
	}
	var lines []string
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) == 3 && !siblings[f[0]] {
			lines = append(lines, strings.TrimSuffix(line, "\n"))
		}
	}
	for _, d := range m.Deps {
		h, ok := hashes[d]
		if !ok {
			return fmt.Errorf("%s requires %s, which is not published yet", m.Path, d)
		}
		lines = append(lines, d+" "+version+" "+h[0], d+" "+version+"/go.mod "+h[1])
	}
	// go.sum is sorted by module path; the lines of one path keep the
	// order go wrote them in (by version, each before its /go.mod).
	slices.SortStableFunc(lines, func(a, b string) int {
		return cmp.Compare(strings.Fields(a)[0], strings.Fields(b)[0])
	})
	if len(lines) == 0 {
		return nil
	}
	return os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

// write publishes m at version into proxy and returns its go.sum hashes.
func write(proxy, tree string, m mod, version string) (zipHash, modHash string, err error) {
	escaped, err := module.EscapePath(m.Path)
	if err != nil {
		return "", "", err
	}
	dir := filepath.Join(proxy, escaped, "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	base := filepath.Join(dir, version)
	gomod, err := os.ReadFile(filepath.Join(tree, m.Dir, "go.mod"))
	if err != nil {
		return "", "", err
	}
	if err := os.WriteFile(base+".mod", gomod, 0o644); err != nil {
		return "", "", err
	}
	var zipped bytes.Buffer
	if err := zip.CreateFromDir(&zipped, module.Version{Path: m.Path, Version: version}, filepath.Join(tree, m.Dir)); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(base+".zip", zipped.Bytes(), 0o644); err != nil {
		return "", "", err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return "", "", err
	}
	if err := os.WriteFile(base+".info", info, 0o644); err != nil {
		return "", "", err
	}
	list, err := os.ReadFile(filepath.Join(dir, "list"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", "", err
	}
	if !slices.Contains(strings.Fields(string(list)), version) {
		list = append(list, version+"\n"...)
		if err := os.WriteFile(filepath.Join(dir, "list"), list, 0o644); err != nil {
			return "", "", err
		}
	}
	if zipHash, err = dirhash.HashZip(base+".zip", dirhash.Hash1); err != nil {
		return "", "", err
	}
	modHash, err = dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gomod)), nil
	})
	return zipHash, modHash, err
}
