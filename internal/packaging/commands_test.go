package packaging_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// documentedBinaries are the programs whose commands the docs name.
var documentedBinaries = []string{"nstance-admin", "nstance-server", "nstance-operator", "nstance-agent"}

// docCommand is one command line found in a document.
type docCommand struct {
	where string
	args  []string // args[0] is the binary
}

func (c docCommand) String() string { return c.where + ": " + strings.Join(c.args, " ") }

var (
	fence      = regexp.MustCompile("(?ms)^\\s*```[^\\n]*\\n(.*?)^\\s*```")
	codeSpan   = regexp.MustCompile("`([^`\\n]+)`")
	envAssign  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
	shellSplit = regexp.MustCompile(`\|\||&&|[|;]|\$\(`)
)

// commandsIn returns the command lines that start with one of the binaries
// in code: fenced blocks (continuation lines joined, comments dropped) and
// inline code spans. A binary counts as the command when it is the first word
// of a shell command, bare or as a path in a bin directory (bin/nstance-admin).
func commandsIn(where, text string) []docCommand {
	var code []string
	for _, m := range fence.FindAllStringSubmatch(text, -1) {
		code = append(code, strings.Split(strings.ReplaceAll(m[1], "\\\n", " "), "\n")...)
	}
	for _, m := range codeSpan.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
		code = append(code, m[1])
	}
	var cmds []docCommand
	for _, line := range code {
		for _, part := range shellSplit.Split(line, -1) {
			var toks []string
			for _, tok := range strings.Fields(part) {
				if strings.HasPrefix(tok, "#") {
					break
				}
				toks = append(toks, tok)
			}
			for len(toks) > 0 && (envAssign.MatchString(toks[0]) || slices.Contains([]string{"$", "sudo", "exec", "env"}, toks[0])) {
				toks = toks[1:]
			}
			if len(toks) == 0 {
				continue
			}
			dir, name := filepath.Split(toks[0])
			if !slices.Contains(documentedBinaries, name) || (dir != "" && filepath.Base(filepath.Clean(dir)) != "bin") {
				continue
			}
			cmds = append(cmds, docCommand{where: where, args: append([]string{name}, toks[1:]...)})
		}
	}
	return cmds
}

func TestCommandsIn(t *testing.T) {
	text := "Run `nstance-admin cluster rotate-ca introduce --force`, not `helm install nstance-server x` or\n" +
		"`cmd/nstance-admin`; prose nstance-server serves.\n" +
		"```sh\nNSTANCE_X=1 bin/nstance-admin instance list \\\n  --all-shards   # nstance-admin ignored\n" +
		"kubectl get pods | nstance-agent --help && /var/lib/nstance-server\n```\n"
	var got []string
	for _, c := range commandsIn("doc", text) {
		got = append(got, strings.Join(c.args, " "))
	}
	require.ElementsMatch(t, []string{"nstance-admin instance list --all-shards", "nstance-agent --help",
		"nstance-admin cluster rotate-ca introduce --force"}, got)
}

// helpText runs `<binary> <path...> --help` once per path.
type helpText struct {
	dir   string
	cache map[string]string
}

func (h *helpText) of(t *testing.T, path []string) string {
	t.Helper()
	key := strings.Join(path, " ")
	if text, ok := h.cache[key]; ok {
		return text
	}
	cmd := exec.Command(filepath.Join(h.dir, path[0]), append(slices.Clone(path[1:]), "--help")...)
	cmd.Env = append(os.Environ(), "HOME="+h.dir, "XDG_CONFIG_HOME="+h.dir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s --help:\n%s", key, out)
	h.cache[key] = string(out)
	return string(out)
}

var commandsHeading = regexp.MustCompile(`(?im)^\s*(available )?commands:\s*$`)

// subcommands lists the command names (aliases included) of a help text's
// commands section, without help.
func subcommands(help string) []string {
	loc := commandsHeading.FindStringIndex(help)
	if loc == nil {
		return nil
	}
	var names []string
	for _, line := range strings.Split(help[loc[1]:], "\n")[1:] {
		if strings.TrimSpace(line) == "" || !strings.HasPrefix(line, " ") {
			break
		}
		first, _, _ := strings.Cut(strings.TrimSpace(line), "  ")
		for _, n := range strings.Split(first, ",") {
			if n = strings.TrimSpace(n); n != "" && n != "help" && n != "h" {
				names = append(names, n)
			}
		}
	}
	return names
}

func flagIn(help, flag string) bool {
	return regexp.MustCompile(`(^|[\s,\[])` + regexp.QuoteMeta(flag) + `([\s,=\]]|$)`).MatchString(help)
}

// takesValue reports whether help shows flag with a value placeholder.
func takesValue(help, flag string) bool {
	return regexp.MustCompile(regexp.QuoteMeta(flag) + ` (value|string|int|duration|float|strings|[A-Z][A-Z_]*)\b`).MatchString(help)
}

// checkCommand walks a documented command through the binary's help: each
// word before the leaf command must be a subcommand its parent lists, and
// every flag must appear in the help of the command or of a parent.
func checkCommand(t *testing.T, h *helpText, c docCommand) error {
	t.Helper()
	path := []string{c.args[0]}
	helps := []string{h.of(t, path)}
	leaf := false
	for i := 1; i < len(c.args); i++ {
		tok := c.args[i]
		if strings.HasPrefix(tok, "-") && tok != "-" {
			flag, _, hasValue := strings.Cut(tok, "=")
			if flag == "--help" || flag == "-h" {
				continue // what the check itself runs on every command
			}
			if !slices.ContainsFunc(helps, func(help string) bool { return flagIn(help, flag) }) {
				return fmt.Errorf("%s: %s has no flag %s", c, strings.Join(path, " "), flag)
			}
			if !hasValue && !leaf && takesValue(helps[len(helps)-1], flag) {
				i++
			}
			continue
		}
		if leaf {
			continue // arguments
		}
		if strings.HasPrefix(tok, "<") {
			// A placeholder (`nstance-admin <version> (...)`, output or
			// a generic form): nothing more to check.
			leaf = true
			continue
		}
		subs := subcommands(helps[len(helps)-1])
		if len(subs) == 0 {
			leaf = true
			continue
		}
		if !slices.Contains(subs, tok) {
			return fmt.Errorf("%s: %s has no command %q (it has %s)", c, strings.Join(path, " "), tok, strings.Join(subs, ", "))
		}
		path = append(path, tok)
		helps = append(helps, h.of(t, path))
	}
	return nil
}

// TestDocumentedCommands checks every nstance-admin / nstance-server /
// nstance-operator / nstance-agent command named in code in the repository's
// Markdown (docs, runbooks, READMEs) and in the alerts' annotations against
// the --help of the binaries built from this tree, subcommands' help
// included.
func TestDocumentedCommands(t *testing.T) {
	files := strings.Fields(run(t, root, "git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"))
	require.NotEmpty(t, files)
	var cmds []docCommand
	for _, f := range files {
		text, err := os.ReadFile(filepath.Join(root, f))
		if os.IsNotExist(err) {
			continue // deleted in the work tree
		}
		require.NoError(t, err)
		cmds = append(cmds, commandsIn(f, string(text))...)
	}
	_, rgs := ruleGroups(t)
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			for key, a := range r.Annotations {
				cmds = append(cmds, commandsIn(monitoringRel+"/prometheusrule.yaml "+r.Alert+" "+key, a)...)
			}
		}
	}
	// What this test exists for: the CA runbook's rotation and the alert's
	// description are found and checked.
	require.True(t, slices.ContainsFunc(cmds, func(c docCommand) bool {
		return strings.HasPrefix(c.where, monitoringRel) && slices.Equal(c.args, []string{"nstance-admin", "cluster", "rotate-ca"})
	}), "the CA alert's command is found")
	require.True(t, slices.ContainsFunc(cmds, func(c docCommand) bool {
		return strings.HasPrefix(c.where, runbooksRel) && len(c.args) > 3 && c.args[2] == "rotate-ca"
	}), "the runbooks' commands are found")
	require.Greater(t, len(cmds), 30)

	dir := t.TempDir()
	pkgs := make([]string, 0, len(documentedBinaries))
	for _, b := range documentedBinaries {
		pkgs = append(pkgs, "./cmd/"+b)
	}
	run(t, root, "go", append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)...)
	h := &helpText{dir: dir, cache: map[string]string{}}

	// The checker refuses what does not exist.
	for _, bad := range [][]string{{"nstance-admin", "ca", "rotate"}, {"nstance-admin", "cluster", "rotate-ca", "introduce", "--no-such-flag"},
		{"nstance-server", "--no-such-flag"}} {
		require.Error(t, checkCommand(t, h, docCommand{where: "self-check", args: bad}), "%v", bad)
	}
	var errs []string
	for _, c := range cmds {
		if err := checkCommand(t, h, c); err != nil {
			errs = append(errs, err.Error())
		}
	}
	require.Empty(t, errs, "documented commands the binaries do not have")
	t.Logf("%d documented commands checked against %d help texts", len(cmds), len(h.cache))
}
