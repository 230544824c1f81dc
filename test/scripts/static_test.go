package scripts

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// logicalLines splits a shell script or recipe into lines, joining
// backslash continuations and dropping comment lines. Each keeps the
// number of its first physical line.
type logicalLine struct {
	n    int
	text string
}

func logicalLines(text string) []logicalLine {
	var out []logicalLine
	var cur strings.Builder
	start := 0
	for i, l := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(l)
		if cur.Len() == 0 {
			if trimmed == "" || strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, "@#") {
				continue
			}
			start = i + 1
		}
		if strings.HasSuffix(l, "\\") {
			cur.WriteString(strings.TrimSuffix(l, "\\") + " ")
			continue
		}
		cur.WriteString(l)
		out = append(out, logicalLine{start, cur.String()})
		cur.Reset()
	}
	return out
}

var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'[^']*'`)

// code is a line without its quoted strings (messages mention commands).
func code(l string) string { return quoted.ReplaceAllString(l, `""`) }

func readFile(t *testing.T, root, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// shellFiles lists every shell script and shell-running config of the
// repository's tooling.
func shellFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{".ci/run", "Makefile", ".air.toml", "deploy/clusterctl/components.sh"}
	for _, pattern := range []string{"scripts/*.sh", "scripts/lib/*.sh", "scripts/air/*.toml"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			rel, _ := filepath.Rel(root, f)
			files = append(files, rel)
		}
	}
	sort.Strings(files)
	return files
}

var (
	// A pipe into a reader that may stop early: under pipefail the writer's
	// SIGPIPE fails the pipeline at random.
	earlyExitPipe = regexp.MustCompile(`(?:^|[^|])\|\s*(?:grep\b[^|]*?\s(?:-[a-zA-Z]*[qm]|--quiet|--silent|--max-count)|head\b|awk\b[^|]*\bexit\b|sed\b[^|]*[0-9;{]q\b)`)
	// A pipeline whose status is deliberately ignored.
	statusIgnored = regexp.MustCompile(`\|\|\s*(?:true|:)\s*(?:;|$)`)
	// `cmd < <(other)`: other's failure is invisible.
	procSubstInput = regexp.MustCompile(`<\s*<\(`)
	// An assignment at the start of a statement.
	assignment = regexp.MustCompile(`(?:^|[\s;&|(])[A-Za-z_][A-Za-z_0-9]*=`)
	// export/local/readonly/declare of a command substitution: the builtin's
	// status (0) replaces the substitution's.
	declLostStatus = regexp.MustCompile(`\b(?:export|local|readonly|declare)(?:\s+-\w+)*\s+(?:[A-Za-z_]\w*(?:=\S*)?\s+)*[A-Za-z_]\w*="?(\$+)\([^(]`)
	// After an assignment's value: what may follow without hiding its status.
	statementEnd = regexp.MustCompile(`^(?:$|;|&&|\|\||\||\)|\}|#|then\b|do\b|fi\b|done\b)`)
)

// lostStatus reports whether line assigns a command substitution and then
// drops its status: as the prefix of a command (VAR=$(x) cmd), before
// another assignment, or through export/local/readonly/declare. subst is
// "$(" for shell and "$$(" for Makefile recipes.
func lostStatus(line, subst string) bool {
	for _, m := range declLostStatus.FindAllStringSubmatch(line, -1) {
		if m[1]+"(" == subst {
			return true
		}
	}
	for _, loc := range assignment.FindAllStringIndex(line, -1) {
		i := loc[1]
		if i < len(line) && line[i] == '"' {
			i++
		}
		if !strings.HasPrefix(line[i:], subst) || strings.HasPrefix(line[i+len(subst):], "(") {
			continue
		}
		depth, j := 1, i+len(subst)
		for ; j < len(line) && depth > 0; j++ {
			switch line[j] {
			case '(':
				depth++
			case ')':
				depth--
			}
		}
		for j < len(line) && line[j] != ' ' && line[j] != '\t' && line[j] != ';' {
			j++ // the rest of the word, e.g. "$(dir)/kubectl"
		}
		if !statementEnd.MatchString(strings.TrimLeft(line[j:], " \t")) {
			return true
		}
	}
	return false
}

// No script pipes into an early-exiting reader, and no command
// substitution's failure is dropped.
func TestScriptsHaveNoPipefailRaces(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	for _, f := range shellFiles(t, root) {
		subst := "$("
		if f == "Makefile" {
			subst = "$$("
		}
		for _, l := range logicalLines(readFile(t, root, f)) {
			c := code(l.text)
			if earlyExitPipe.MatchString(c) && !statusIgnored.MatchString(c) {
				t.Errorf("%s:%d pipes into a reader that can exit early (SIGPIPE + pipefail): capture the output first\n\t%s", f, l.n, strings.TrimSpace(l.text))
			}
			if procSubstInput.MatchString(c) {
				t.Errorf("%s:%d reads from a process substitution, whose exit status is lost: capture the output first\n\t%s", f, l.n, strings.TrimSpace(l.text))
			}
			if lostStatus(l.text, subst) {
				t.Errorf("%s:%d drops a command substitution's exit status: assign it on its own line first\n\t%s", f, l.n, strings.TrimSpace(l.text))
			}
		}
	}
}

// The checks above catch what they are meant to catch.
func TestPipefailPatterns(t *testing.T) {
	for _, bad := range []string{
		`"$dir/etcd" --version | grep -q 3.6`,
		`air -v 2>/dev/null | grep -q v1.67.4 || make air`,
		`x=$(ps | head -1)`,
		`v=$(cmd | awk '/v/ { print; exit }')`,
		`cat f | sed -n 1q`,
		`cat f | grep -m1 x`,
	} {
		if !earlyExitPipe.MatchString(code(bad)) && !earlyExitPipe.MatchString(bad) {
			t.Errorf("not flagged as an early-exit pipe: %s", bad)
		}
	}
	if !procSubstInput.MatchString(code(`read -r a b < <(python3 -c 'x' "$f")`)) {
		t.Error("input from a process substitution not flagged")
	}
	if !statusIgnored.MatchString(code(`grep -E '^(FAIL)' "$log" | head -n 20 || true`)) {
		t.Error("a pipeline ending in || true is not recognised as ignoring its status")
	}
	for _, good := range []string{`a || grep -q x f`, `git ls-files | grep -v '^x/'`, `ps | awk '{ print $2 }'`, `grep -q x "$f"`} {
		if earlyExitPipe.MatchString(code(good)) {
			t.Errorf("flagged as an early-exit pipe: %s", good)
		}
	}
	for _, bad := range []string{
		`KUBEBUILDER_ASSETS=$(scripts/envtest-assets.sh) go test ./...`,
		`export K=$(scripts/x.sh)`,
		`local v=$(cmd)`,
		`local a b="$(cmd x)"`,
		`a=$(false) b=$(true)`,
	} {
		if !lostStatus(bad, "$(") {
			t.Errorf("not flagged as a lost status: %s", bad)
		}
	}
	for _, good := range []string{
		`v=$(cmd)`,
		`local n=$((1 + 2))`,
		`v=$(cmd) || die x`,
		`export A=b`,
		`reg=$(port_of "$n" 8992); op=$(port_of "$n" 8993)`,
		`x="$(dirname "$k")/kubectl"`,
		`rc=0; drift=$(cd $m && progress_run "x" $(GO) mod tidy -diff) || rc=$?`,
		`if out=$(f); then :; fi`,
	} {
		if lostStatus(good, "$(") {
			t.Errorf("flagged as a lost status: %s", good)
		}
	}
	if !lostStatus(`KUBEBUILDER_ASSETS=$$(scripts/envtest-assets.sh) $(GO) test`, "$$(") || !lostStatus(`export A=$$(x)`, "$$(") {
		t.Error("Makefile form not flagged")
	}
	if lostStatus(`export NSTANCE_DEV_DIR=$(DEV_DIR) X=$(2); exec x`, "$$(") {
		t.Error("make variables flagged as command substitutions")
	}
}

var (
	longShellStep = regexp.MustCompile(`\b(?:make|apt-get|go\s+(?:build|install|test|mod\s+(?:download|tidy)))\b`)
	// Words that name a program without running it: `command -v make`,
	// array literals such as tools=(make:make ...).
	notCommands  = regexp.MustCompile(`command -v \S+|\b\w+=\([^)]*\)`)
	longMakeStep = regexp.MustCompile(`\$\(GO\)\s+(?:build|install|test|vet)\b|\$\(MAKE\)|\$\(call go-install,`)
)

// requireProgress fails for every line of text with a long step that does
// not run through progress_run.
func requireProgress(t *testing.T, name, text string, long *regexp.Regexp, allow func(string) bool) {
	t.Helper()
	for _, l := range logicalLines(text) {
		c := notCommands.ReplaceAllString(code(l.text), "")
		if long.MatchString(c) && !strings.Contains(c, "progress_run") && (allow == nil || !allow(c)) {
			t.Errorf("%s:%d runs a long step without progress (use progress_run from scripts/lib/progress.sh)\n\t%s", name, l.n, strings.TrimSpace(l.text))
		}
	}
}

// recipes returns each Makefile target's prerequisites and recipe.
func recipes(makefile string) (prereqs, recipe map[string]string) {
	prereqs, recipe = map[string]string{}, map[string]string{}
	rule := regexp.MustCompile(`^([A-Za-z0-9_.\-$()/]+):(?:[^=]|$)(.*)`)
	var cur string
	for _, l := range strings.Split(makefile, "\n") {
		if strings.HasPrefix(l, "\t") && cur != "" {
			recipe[cur] += l + "\n"
			continue
		}
		cur = ""
		if m := rule.FindStringSubmatch(l); m != nil {
			cur = m[1]
			deps := m[2]
			if i := strings.Index(deps, "##"); i >= 0 {
				deps = deps[:i]
			}
			prereqs[cur] = strings.TrimSpace(deps)
		}
	}
	return prereqs, recipe
}

// Every long step of .ci/run, scripts/envtest-assets.sh and the
// `make dev-tmux-k8s` start-up prints progress through scripts/lib/progress.sh.
func TestLongStepsReportProgress(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	sourcesLib := func(name, text string) {
		if !strings.Contains(text, "scripts/lib/progress.sh") && !strings.Contains(text, `source "$(dirname "$0")/dev-common.sh"`) {
			t.Errorf("%s does not source scripts/lib/progress.sh", name)
		}
	}

	ci := readFile(t, root, ".ci/run")
	sourcesLib(".ci/run", ci)
	requireProgress(t, ".ci/run", ci, longShellStep, nil)
	if !regexp.MustCompile(`(?m)^scripts/envtest-assets\.sh\b`).MatchString(ci) {
		t.Error(".ci/run does not build the envtest assets with scripts/envtest-assets.sh (which reports its own progress)")
	}

	envtest := readFile(t, root, "scripts/envtest-assets.sh")
	sourcesLib("scripts/envtest-assets.sh", envtest)
	requireProgress(t, "scripts/envtest-assets.sh", envtest, longShellStep, nil)

	mk := readFile(t, root, "Makefile")
	prereqs, recipe := recipes(mk)
	// The targets `make test` and `make dev-tmux-k8s` run, and every tool
	// installed into ./bin.
	targets := []string{"build", "dev-binaries", "check", "test-go", "lint", "verify-tidy"}
	for target := range recipe {
		if strings.HasPrefix(target, "$(BIN)/") || target == "$(OVERMIND)" {
			targets = append(targets, target)
		}
	}
	if len(targets) < 10 {
		t.Errorf("found only %d tool rules: %q", len(targets)-6, targets[6:])
	}
	goInstall := regexp.MustCompile(`(?m)^go-install = .*\\\n\s*progress_run `)
	if !goInstall.MatchString(mk) {
		t.Error("the Makefile's go-install does not run through progress_run")
	}
	for _, target := range targets {
		r, ok := recipe[target]
		if !ok {
			t.Errorf("Makefile has no recipe for %s", target)
			continue
		}
		requireProgress(t, "Makefile "+target, r, longMakeStep, func(c string) bool { return strings.Contains(c, "$(call go-install,") })
	}
	// The start-up: its prerequisites are the targets checked above, its
	// processes are the Procfile entries checked below, and `ready` waits for
	// them with a heartbeat and prints the summary.
	for _, dep := range strings.Fields(prereqs["dev-tmux-k8s"]) {
		// envtest-assets is scripts/envtest-assets.sh, whose builds report
		// progress (TestEnvtestBuildProgress).
		if dep != "check" && dep != "dev-binaries" && dep != "envtest-assets" {
			t.Errorf("make dev-tmux-k8s has prerequisite %s, which this test does not check for progress", dep)
		}
	}
	if !strings.Contains(recipe["dev-tmux-k8s"], "$(call dev-start,s3$(comma)server$(comma)k8s$(comma)operator$(comma)status,") {
		t.Errorf("make dev-tmux-k8s no longer starts s3, server, k8s, operator and status through dev-start:\n%s", recipe["dev-tmux-k8s"])
	}
	if !strings.Contains(mk, "-l $(1)$(comma)lb$(comma)ready -c ready$(comma)lb") {
		t.Error("dev-start does not add the `lb` (HAProxy, optional) and `ready` (start-up summary) processes with --can-die")
	}

	procfile := map[string]string{}
	for _, l := range strings.Split(readFile(t, root, "Procfile"), "\n") {
		if name, cmd, ok := strings.Cut(l, ":"); ok {
			procfile[name] = strings.TrimSpace(cmd)
		}
	}
	for _, p := range []string{"s3", "server", "k8s", "operator", "status", "ready", "lb"} {
		script := procfile[p]
		if !strings.HasPrefix(script, "scripts/dev-") {
			t.Errorf("Procfile entry %q is %q, want a scripts/dev-*.sh script", p, script)
			continue
		}
		text := readFile(t, root, script)
		sourcesLib(script, text)
		// Air's own builds (-build.cmd) are covered by `ready`'s waits.
		requireProgress(t, script, text, longShellStep, func(c string) bool { return strings.Contains(c, "-build.cmd") })
		for _, l := range logicalLines(text) {
			if regexp.MustCompile(`\bsleep\b`).MatchString(code(l.text)) {
				t.Errorf("%s:%d sleeps in a loop of its own; wait with wait_for (progress_wait)\n\t%s", script, l.n, strings.TrimSpace(l.text))
			}
		}
	}
	common := readFile(t, root, "scripts/dev-common.sh")
	for _, want := range []string{`progress_wait "$desc" "$secs" "$@"`, `progress_run "building bin/$b"`, `source "$NSTANCE_ROOT/scripts/lib/progress.sh"`} {
		if !strings.Contains(common, want) {
			t.Errorf("scripts/dev-common.sh lacks %s", want)
		}
	}
	ready := readFile(t, root, "scripts/dev-ready.sh")
	for _, want := range []string{`wait_for "dev-s3 on`, `wait_for "server $n`, `wait_for "the operator's readiness probe`, "export KUBECONFIG=", "tmux attach -t", "make clean-dev", "Ctrl+C"} {
		if !strings.Contains(ready, want) {
			t.Errorf("scripts/dev-ready.sh lacks %s", want)
		}
	}
}
