package nodecarry_test

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// env is one API server for the package's envtest tests.
var env *kubetest.Env

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(kubetest.RunMain(m, &env))
}
