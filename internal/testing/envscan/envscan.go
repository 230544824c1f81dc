// Package envscan finds the environment variables a binary can read by
// name: every string literal matching a pattern in the non-test Go files of
// this module's packages that the binary links. Help tests use it to check
// that a --help lists every variable.
package envscan

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Names are the NSTANCE_* names.
var Names = regexp.MustCompile(`^NSTANCE_[A-Z0-9_]+$`)

// Literals returns, sorted, every string literal matching name in the
// non-test Go files of the main module's packages that pkg (an import path)
// links, with the packages that mention each.
func Literals(pkg string, name *regexp.Regexp) (map[string][]string, error) {
	out, err := exec.Command("go", "list", "-deps", "-f",
		`{{if and (not .Standard) .Module}}{{if .Module.Main}}{{.ImportPath}}{{"\t"}}{{.Dir}}{{"\t"}}{{join .GoFiles " "}}{{end}}{{end}}`,
		pkg).Output()
	if err != nil {
		return nil, fmt.Errorf("go list -deps %s: %w", pkg, err)
	}
	found := map[string][]string{}
	fset := token.NewFileSet()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		parts := strings.SplitN(line, "\t", 3)
		if len(parts) != 3 {
			continue
		}
		imp, dir, files := parts[0], parts[1], parts[2]
		for _, file := range strings.Fields(files) {
			f, err := parser.ParseFile(fset, filepath.Join(dir, file), nil, parser.SkipObjectResolution)
			if err != nil {
				return nil, fmt.Errorf("parse %s: %w", file, err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				if s, err := strconv.Unquote(lit.Value); err == nil && name.MatchString(s) {
					found[s] = append(found[s], imp)
				}
				return true
			})
		}
	}
	for k := range found {
		sort.Strings(found[k])
	}
	return found, nil
}
