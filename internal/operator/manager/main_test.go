package manager_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// env is one API server for the package; each test uses its own namespace.
var env *kubetest.Env

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrllog.SetLogger(logr.Discard())
	e, stop, err := kubetest.StartEnv()
	if err != nil {
		fmt.Fprintf(os.Stderr, "start envtest: %v\n", err)
		return 1
	}
	env = e
	code := m.Run()
	if err := stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stop envtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
