package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	opmanager "github.com/nstance-dev/nstance/internal/operator/manager"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/internal/testing/syncbuf"
)

// TestOperatorStartsWithZapFlagsAndSecureDiagnostics runs the operator
// binary against a real kube-apiserver with the flags a kubebuilder seed
// passes (--zap-log-level=debug --zap-encoder=console): it starts, logs in
// the console format at debug level, and serves /metrics on
// --diagnostics-address over HTTPS to authenticated and authorized
// callers only (TokenReview, SubjectAccessReview).
func TestOperatorStartsWithZapFlagsAndSecureDiagnostics(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		if _, err := kubetest.AssetsDir(); err != nil {
			t.Skipf("no envtest assets: %v", err)
		}
	}
	e := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(e.Config)
	require.NoError(t, err)
	const ns = "nstance-system"
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// Another replica holds the lease: this operator stays a standby, so no
	// shard is needed, while the manager (and its diagnostics server) runs.
	now := metav1.NewMicroTime(time.Now())
	_, err = cs.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: opmanager.LeaderElectionID},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("another-replica"), LeaseDurationSeconds: ptr.To[int32](3600),
			AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("cluster_id: c1\ntenant: t1\nshards:\n  s1:\n    registration_addr: 127.0.0.1:1\n    operator_addr: 127.0.0.1:1\n"), 0o600))
	diag := portpick.Addr(t)
	cmd := exec.Command(bin(t, "nstance-operator"), "--kubeconfig="+e.Kubeconfig, "--config="+cfg, "--leader-elect",
		"--disable-webhooks", "--health-probe-bind-address=127.0.0.1:0", "--diagnostics-address="+diag,
		"--zap-log-level=debug", "--zap-encoder=console")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "NSTANCE_NAMESPACE=" + ns}
	var logs syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	// The endpoint's certificate is self-signed (no --webhook-cert-dir for
	// it): only the authentication is checked here.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed diagnostics certificate
	get := func(token string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+diag+"/metrics", nil)
		if err != nil {
			return 0, "", err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	var code int
	require.Eventually(t, func() bool {
		select {
		case err := <-exited:
			t.Fatalf("operator exited (%v):\n%s", err, logs.String())
		default:
		}
		code, _, err = get("")
		return err == nil
	}, 2*time.Minute, 100*time.Millisecond, "no diagnostics server on %s:\n%s", diag, logs.String())
	require.Equal(t, http.StatusUnauthorized, code, "no token: refused")

	// A ServiceAccount token: authenticated, but not allowed until bound to
	// a role that may get /metrics.
	_, err = cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "scraper"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "scraper", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	require.NoError(t, err)
	code, _, err = get(tr.Status.Token)
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, code, "authenticated, not authorized")
	_, err = cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "scraper"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "scraper"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	var body string
	require.Eventually(t, func() bool {
		code, body, err = get(tr.Status.Token)
		return err == nil && code == http.StatusOK
	}, time.Minute, 100*time.Millisecond, "the bound scraper is never allowed (last %d %v)", code, err)
	require.Contains(t, body, "controller_runtime_", "the manager's metrics")

	// The logs: console format (not JSON) at debug level, one logger for
	// ours and controller-runtime's entries.
	out := logs.String()
	first, _, _ := strings.Cut(out, "\n")
	require.Regexp(t, `^\S+\tINFO\t\S+\tstarting\t\{"binary": "nstance-operator"`, first, "console encoder, version first")
	require.Regexp(t, `(?m)^\S+\tDEBUG\t\S+\tflags\t.*"diagnosticsAddress": "`+diag+`"`, out, "debug level")
	require.Regexp(t, `(?m)^\S+\tINFO\tcontroller-runtime.metrics\t\S+\tServing metrics server\t.*"secure": true`, out, "controller-runtime logs through the same logger")
	select {
	case err := <-exited:
		require.NoError(t, errors.New("operator exited"), "%v:\n%s", err, out)
	default:
	}
}
