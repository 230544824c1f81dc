package controlplane_test

import (
	"os"
	"testing"

	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// env is one API server for the package; each test uses its own namespace.
var env *kubetest.Env

func TestMain(m *testing.M) {
	os.Exit(kubetest.RunMain(m, &env))
}
