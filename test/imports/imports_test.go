// Package imports checks the import graph of the module: a package under
// internal/<a> imports another component's package (internal/<b>/..., b != a)
// only when that package is a documented shared leaf, or through one of the
// few commented exceptions below. Leaves themselves import no component.
//
// Packages under pkg/ and api/ import nothing under internal/; commands
// (cmd/...) and test/... may import any internal package.
//
// Only the packages that are compiled into binaries are checked (Imports, not
// TestImports): tests may run the real stack of another component in-process
// (shardtest, grpcserve, devs3test); tests that run an agent against a real
// shard server live in test/agent.
package imports

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/nstance-dev/nstance/"

// leaves are the shared leaf packages: any component may import them, and
// they import only other leaves. An entry ending in "/..." covers the
// packages below it. Keep docs/architecture.md ("Import rule") in step.
var leaves = []string{
	"internal/atomicfile",  // write-to-temp-then-rename files
	"internal/carotation",  // CA rotation steps, run by nstance-admin and test/chaos
	"internal/cliconv",     // exit codes, usage errors and --version of every binary
	"internal/config",      // the shard configuration schema: parse, defaults, validation
	"internal/devguard",    // dev-s3 and dev-k8s: no CORS, no other origins' pages, Host check
	"internal/importedca",  // CAs the admin imports: stored by nstance-admin, loaded by the server
	"internal/keytype",     // key algorithm names shared by agent and server
	"internal/layout",      // every object-storage key, ValidateID
	"internal/logging",     // the logger every binary builds
	"internal/msgsize",     // gRPC message size limits
	"internal/nonce",       // registration JWTs and the used-nonce ledger
	"internal/pki",         // CAs, certificates, TLS configs
	"internal/regoutcome",  // what a Registration error means to a client (agent, operator)
	"internal/secrets",     // sealed envelopes and keyrings
	"internal/storage",     // opening the object store, retries, conditional writes
	"internal/streamloop",  // following a server stream: reopen with backoff, count reopenings
	"internal/version",     // the build version
	"internal/workloadca",  // each tenant's workload CA: created by the shard leader, refused as an import by nstance-admin
	"internal/testing/...", // test helpers (bind, host tools, envtest, processes)
	// encryption keys from AWS Secrets Manager / SSM (imports only secrets)
	"internal/secrets/awssecrets",
	// encryption keys and secret files from Google Secret Manager (imports only secrets)
	"internal/secrets/gcpsecrets",
}

// exception is an import from one component into another's internals that
// is allowed for the reason given. Each must still be used (a stale entry
// fails), so removing the import also removes the exception.
type exception struct {
	from, to string // import paths relative to the module; to may end in "/..."
	why      string
}

// None are needed today; the mechanism stays for the next one (it must be
// argued here, and a stale one fails).
var exceptions = []exception{}

type pkg struct {
	ImportPath string
	Imports    []string
	Error      *struct{ Err string }
}

// component returns "a" for internal/a/..., or "" outside internal/.
func component(path string) string {
	rest, ok := strings.CutPrefix(path, "internal/")
	if !ok {
		return ""
	}
	c, _, _ := strings.Cut(rest, "/")
	return c
}

func matches(pattern, path string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

func isLeaf(path string) bool {
	return slices.ContainsFunc(leaves, func(l string) bool { return matches(l, path) })
}

// check returns every import that breaks the rule, and every leaf or
// exception entry that no package uses. graph maps a package (relative to
// the module) to its internal imports (relative as well).
func check(graph map[string][]string) []string { return checkWith(graph, exceptions) }

// checkWith is check with the given exceptions.
func checkWith(graph map[string][]string, exceptions []exception) []string {
	var bad []string
	used := make([]bool, len(exceptions))
	leafSeen := map[string]bool{}
	paths := make([]string, 0, len(graph))
	for p := range graph {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, from := range paths {
		if isLeaf(from) {
			for _, l := range leaves {
				if matches(l, from) {
					leafSeen[l] = true
				}
			}
		}
		for _, to := range graph[from] {
			a, b := component(from), component(to)
			if b == "" {
				continue
			}
			if strings.HasPrefix(from, "pkg/") || strings.HasPrefix(from, "api/") {
				bad = append(bad, fmt.Sprintf("public package %s imports %s", from, to))
				continue
			}
			if a == "" || a == b && !isLeaf(from) {
				continue // commands and tests under test/ assemble components; a component owns its packages
			}
			if isLeaf(from) {
				if !isLeaf(to) {
					bad = append(bad, fmt.Sprintf("leaf %s imports %s, which is not a shared leaf", from, to))
				}
				continue
			}
			if isLeaf(to) {
				continue
			}
			i := slices.IndexFunc(exceptions, func(e exception) bool { return e.from == from && matches(e.to, to) })
			if i < 0 {
				bad = append(bad, fmt.Sprintf("%s imports %s: another component's internals (use a shared leaf package or add a commented exception)", from, to))
				continue
			}
			used[i] = true
		}
	}
	for i, e := range exceptions {
		if !used[i] {
			bad = append(bad, fmt.Sprintf("exception %s -> %s is no longer needed; remove it", e.from, e.to))
		}
	}
	for _, l := range leaves {
		if !leafSeen[l] {
			bad = append(bad, fmt.Sprintf("leaf %s matches no package; remove it", l))
		}
	}
	return bad
}

func moduleGraph(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,Error", "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("go list: %v\n%s", err, ee.Stderr)
	}
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	graph := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list %s: %s", p.ImportPath, p.Error.Err)
		}
		from, ok := strings.CutPrefix(p.ImportPath, module)
		if !ok {
			continue
		}
		graph[from] = nil
		for _, imp := range p.Imports {
			if to, ok := strings.CutPrefix(imp, module); ok && strings.HasPrefix(to, "internal/") {
				graph[from] = append(graph[from], to)
			}
		}
	}
	if len(graph) < 50 {
		t.Fatalf("go list found %d packages of the module; expected the whole module", len(graph))
	}
	return graph
}

// TestImportGraph checks the module as it is.
func TestImportGraph(t *testing.T) {
	for _, v := range check(moduleGraph(t)) {
		t.Error(v)
	}
}

// TestCheckCatchesBackImports shows that check refuses what the rule
// forbids, on small made-up graphs next to the real leaves and a made-up
// exception.
func TestCheckCatchesBackImports(t *testing.T) {
	exc := []exception{{"internal/admin/clustercmd", "internal/server/x", "made up for this test"}}
	// base is a graph that passes: every leaf and exception in use.
	base := func() map[string][]string {
		g := map[string][]string{
			"internal/server/app":       {"internal/config", "internal/layout", "internal/testing/kubetest"},
			"internal/config":           {"internal/pki"},
			"internal/server/x":         nil,
			"internal/server/y":         nil,
			"internal/admin/clustercmd": {"internal/storage", "internal/carotation", "internal/server/x"},
			"internal/carotation":       {"internal/config"},
			"internal/storage":          {"internal/layout"},
			"internal/nonce":            {"internal/layout"},
			"cmd/nstance-server":        {"internal/server/app"},
		}
		for _, l := range leaves {
			p := strings.TrimSuffix(l, "/...")
			if _, ok := g[p]; !ok {
				g[p] = nil
			}
		}
		return g
	}
	if v := checkWith(base(), exc); len(v) != 0 {
		t.Fatalf("the passing graph was refused: %v", v)
	}
	for name, tc := range map[string]struct {
		edit func(map[string][]string)
		want string
	}{
		"component imports another's internals": {
			func(g map[string][]string) {
				g["internal/admin/clustercmd"] = append(g["internal/admin/clustercmd"], "internal/server/y")
			},
			"internal/admin/clustercmd imports internal/server/y",
		},
		"leaf imports a component": {
			func(g map[string][]string) { g["internal/nonce"] = append(g["internal/nonce"], "internal/server/x") },
			"leaf internal/nonce imports internal/server/x",
		},
		"leaf imports a same-named component's package": {
			func(g map[string][]string) {
				g["internal/testing/kubetest"] = []string{"internal/testing/kubetest/internal/x"}
				g["internal/testing/kubetest/internal/x"] = []string{"internal/operator/machine"}
			},
			"leaf internal/testing/kubetest/internal/x imports internal/operator/machine",
		},
		"stale exception": {
			func(g map[string][]string) { g["internal/admin/clustercmd"] = []string{"internal/storage"} },
			"exception internal/admin/clustercmd -> internal/server/x is no longer needed",
		},
		"exception is for one package only": {
			func(g map[string][]string) { g["internal/agent/app"] = []string{"internal/server/x"} },
			"internal/agent/app imports internal/server/x",
		},
		"public package imports internal": {
			func(g map[string][]string) { g["pkg/objstore"] = []string{"internal/layout"} },
			"public package pkg/objstore imports internal/layout",
		},
		"stale leaf": {
			func(g map[string][]string) { delete(g, "internal/msgsize") },
			"leaf internal/msgsize matches no package",
		},
	} {
		t.Run(name, func(t *testing.T) {
			g := base()
			tc.edit(g)
			v := checkWith(g, exc)
			if !slices.ContainsFunc(v, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Fatalf("want a violation containing %q, got %v", tc.want, v)
			}
		})
	}
}
