package v1beta1_test

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// env is one kube-apiserver + etcd shared by every test in this package;
// starting it costs seconds, so TestMain does it once. Tests isolate
// themselves with a namespace each and delete what they create.
var env *kubetest.Env

func TestMain(m *testing.M) {
	os.Exit(kubetest.RunMain(m, &env))
}

// newNamespace creates a namespace for one test. envtest runs no namespace
// controller, so the namespace itself stays Terminating after the test; the
// objects inside are deleted by create's cleanup.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "crd-test-"}}
	require.NoError(t, env.Client.Create(t.Context(), ns))
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), ns)
	})
	return ns.Name
}

// create stores obj and deletes it when the test ends.
func create(t *testing.T, obj client.Object) {
	t.Helper()
	require.NoError(t, env.Client.Create(t.Context(), obj))
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), obj); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete %T %s: %v", obj, obj.GetName(), err)
		}
	})
}
