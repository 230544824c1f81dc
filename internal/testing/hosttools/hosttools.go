package hosttools

import (
	"os/exec"
	"testing"
)

// Hint says how to install a program a test runs; Debian package names match
// what .ci/run installs.
func Hint(name string) string {
	switch name {
	case "aws":
		return "apt-get install awscli (the tests use aws CLI v1; pip install awscli works too)"
	case "chromium":
		return "apt-get install chromium (headless browser tests)"
	case "curl":
		return "apt-get install curl"
	case "git":
		return "apt-get install git (macOS: xcode-select --install)"
	case "haproxy":
		return "apt-get install haproxy (load balancer tests; 2.4 or later)"
	case "make":
		return "apt-get install make (macOS: xcode-select --install)"
	case "ps":
		return "apt-get install procps"
	case "shellcheck":
		return "apt-get install shellcheck (macOS: brew install shellcheck)"
	case "systemd-analyze":
		return "apt-get install systemd"
	case "tmux":
		return "apt-get install tmux (macOS: brew install tmux)"
	}
	return "install " + name + " and put it in PATH"
}

// Require returns the path of program name, or fails the test right away,
// naming the program and how to install it.
func Require(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is required by this test but was not found in PATH: %s; .ci/run installs it on Debian", name, Hint(name))
	}
	return path
}
