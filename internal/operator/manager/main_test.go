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

// clusterB is the workload cluster of the management-mode tests, a second
// API server started by the first test that needs it.
var clusterB kubetest.Lazy

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	code := kubetest.RunMain(m, &env)
	if err := clusterB.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stop second envtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
