package hosttools_test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/nstance-dev/nstance/internal/testing/hosttools"
)

// fakeT records Fatalf instead of stopping the test goroutine.
type fakeT struct {
	testing.TB
	failed bool
	msg    string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = true
	f.msg = fmt.Sprintf(format, args...)
}

func TestRequire(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatalf("sh: %v", err)
	}
	ft := &fakeT{TB: t}
	if got := hosttools.Require(ft, "sh"); got != sh || ft.failed {
		t.Fatalf("Require(sh) = %q, failed=%v; want %q", got, ft.failed, sh)
	}

	t.Setenv("PATH", t.TempDir())
	ft = &fakeT{TB: t}
	hosttools.Require(ft, "tmux")
	if !ft.failed {
		t.Fatal("Require(tmux) with an empty PATH did not fail")
	}
	for _, want := range []string{"tmux", "apt-get install tmux", ".ci/run"} {
		if !strings.Contains(ft.msg, want) {
			t.Errorf("failure message %q lacks %q", ft.msg, want)
		}
	}
	if h := hosttools.Hint("frobnicate"); !strings.Contains(h, "frobnicate") {
		t.Errorf("Hint for an unknown program = %q", h)
	}
}
