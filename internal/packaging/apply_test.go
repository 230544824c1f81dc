package packaging_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"

	opconfig "github.com/nstance-dev/nstance/internal/operator/config"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// certManagerKinds cannot be applied: envtest has no cert-manager CRDs. Their
// shape is checked by TestChartRenders instead.
func withoutCertManager(t *testing.T, objs []object) []object {
	t.Helper()
	var out []object
	for _, o := range objs {
		if strings.HasPrefix(o.APIVersion, "cert-manager.io/") {
			t.Logf("not applied (no cert-manager CRDs in envtest): %s", o)
			continue
		}
		out = append(out, o)
	}
	return out
}

func kubectl(t *testing.T, e *kubetest.Env, stdin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := e.Kubectl(ctx, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, err, "kubectl %s\n%s", strings.Join(args, " "), stderr.String())
	// Only warnings are tolerated on stderr (e.g. objects envtest created
	// without kubectl's last-applied annotation).
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		require.True(t, line == "" || strings.HasPrefix(line, "Warning:"), "kubectl %s: %s", strings.Join(args, " "), line)
	}
	return stdout.String()
}

func ensureNamespaces(t *testing.T, e *kubetest.Env, names ...string) {
	t.Helper()
	for _, ns := range names {
		out, err := e.Kubectl(context.Background(), "create", "namespace", ns).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "AlreadyExists") {
			t.Fatalf("create namespace %s: %v\n%s", ns, err, out)
		}
	}
}

// applyDryRun sends the objects to the API server with --dry-run=server:
// schema validation, defaulting and admission all run, nothing is stored.
func applyDryRun(t *testing.T, e *kubetest.Env, objs []object) {
	t.Helper()
	out := kubectl(t, e, encode(t, objs), "apply", "--dry-run=server", "-f", "-")
	for _, o := range objs {
		require.Contains(t, out, "/"+o.Metadata.Name+" ", "kubectl did not report %s:\n%s", o, out)
	}
}

func TestChartAppliesToAPIServer(t *testing.T) {
	e := apiServer(t)
	for _, r := range renderings() {
		t.Run(r.name, func(t *testing.T) {
			ensureNamespaces(t, e, r.namespace, r.work(), "team-a") // the sample's rbac.secretNamespaces
			applyDryRun(t, e, withoutCertManager(t, render(t, r)))
		})
	}
}

// access is one SubjectAccessReview.
type access struct {
	user        string
	namespace   string
	group       string
	resource    string
	subresource string
	verb        string
	name        string
	path        string // non-resource URL
}

func (a access) String() string {
	if a.path != "" {
		return fmt.Sprintf("%s %s", a.verb, a.path)
	}
	r := a.resource
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	return fmt.Sprintf("%s %s.%s %q in %q", a.verb, r, a.group, a.name, a.namespace)
}

func allowed(t *testing.T, e *kubetest.Env, a access) bool {
	t.Helper()
	ns, name, _ := strings.Cut(strings.TrimPrefix(a.user, "system:serviceaccount:"), ":")
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   a.user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}}
	require.NotEmpty(t, name)
	if a.path != "" {
		sar.Spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Path: a.path, Verb: a.verb}
	} else {
		sar.Spec.ResourceAttributes = &authorizationv1.ResourceAttributes{
			Namespace: a.namespace, Group: a.group, Resource: a.resource,
			Subresource: a.subresource, Verb: a.verb, Name: a.name,
		}
	}
	require.NoError(t, e.Client.Create(context.Background(), sar))
	return sar.Status.Allowed
}

// TestServiceAccountPermissions installs the sample rendering (operator in
// one namespace, managing another) and asks the API server, as each chart
// ServiceAccount, for every access the code needs, and for some it must not
// have.
func TestServiceAccountPermissions(t *testing.T) {
	e := apiServer(t)
	r := renderings()[1]
	require.Equal(t, "sample", r.name)
	require.NotEqual(t, r.namespace, r.work(), "the sample must exercise a separate managed namespace")
	ensureNamespaces(t, e, r.namespace, r.work(), "team-a")
	var objs []object
	for _, o := range withoutCertManager(t, render(t, r)) {
		if o.Kind != "ValidatingWebhookConfiguration" { // would intercept other tests' pools
			objs = append(objs, o)
		}
	}
	kubectl(t, e, encode(t, objs), "apply", "-f", "-")

	operator := "system:serviceaccount:" + r.namespace + ":" + release
	workload := "system:serviceaccount:" + r.work() + ":" + opconfig.DefaultCAPIServiceAccount
	var want []access
	// Everything the operator's RBAC markers declare, cluster-wide and in
	// the managed namespace.
	clusterRules, namespacedRules := generatedRoles(t)
	for _, rule := range slices.Concat(clusterRules, namespacedRules) {
		for _, g := range rule.APIGroups {
			for _, res := range rule.Resources {
				resource, sub, _ := strings.Cut(res, "/")
				for _, v := range rule.Verbs {
					a := access{user: operator, namespace: r.work(), group: g, resource: resource, subresource: sub, verb: v}
					if len(rule.ResourceNames) > 0 {
						a.name = rule.ResourceNames[0]
					}
					want = append(want, a)
				}
			}
		}
	}
	// What controller-runtime and bootstrap need beyond the markers.
	for _, ns := range []string{r.namespace, r.work()} {
		for _, v := range []string{"get", "create", "update"} {
			want = append(want, access{user: operator, namespace: ns, group: "coordination.k8s.io", resource: "leases", verb: v, name: "nstance-operator-leader-election"})
		}
	}
	want = append(want,
		access{user: operator, namespace: r.work(), resource: "events", verb: "create"},
		access{user: operator, namespace: r.work(), group: "events.k8s.io", resource: "events", verb: "create"},
		access{user: operator, namespace: r.work(), resource: "configmaps", verb: "get", name: opconfig.DefaultCAConfigMap},
		access{user: operator, namespace: r.work(), resource: "secrets", verb: "get", name: opconfig.DefaultNonceSecret},
		access{user: operator, namespace: r.work(), resource: "secrets", verb: "create"},
		access{user: operator, namespace: r.work(), resource: "secrets", verb: "update", name: opconfig.DefaultCertSecret},
		access{user: operator, namespace: r.work(), resource: "secrets", verb: "patch", name: "example-cluster-kubeconfig"},
		access{user: operator, namespace: r.work(), resource: "serviceaccounts", subresource: "token", verb: "create", name: opconfig.DefaultCAPIServiceAccount},
		// rbac.secretNamespaces: bootstrap data Secrets of pools there.
		access{user: operator, namespace: "team-a", resource: "secrets", verb: "get", name: "pool-bootstrap"},
		// Core Cluster API, through the managed kubeconfig.
		access{user: workload, resource: "nodes", verb: "list"},
		access{user: workload, resource: "nodes", verb: "watch"},
		access{user: workload, resource: "nodes", verb: "patch", name: "node-1"},
		access{user: workload, resource: "nodes", verb: "delete", name: "node-1"},
		access{user: workload, resource: "pods", verb: "list"},
		access{user: workload, namespace: "kube-system", resource: "pods", subresource: "eviction", verb: "create", name: "p"},
		access{user: workload, namespace: "kube-system", group: "apps", resource: "daemonsets", verb: "get", name: "d"},
		access{user: workload, group: "storage.k8s.io", resource: "volumeattachments", verb: "list"},
		access{user: workload, path: "/", verb: "get"},
	)
	for _, a := range want {
		require.True(t, allowed(t, e, a), "%s denied: %s", a.user, a)
	}

	// Neither is a cluster administrator.
	for _, user := range []string{operator, workload} {
		for _, a := range []access{
			{group: "*", resource: "*", verb: "*"},
			{group: "rbac.authorization.k8s.io", resource: "clusterrolebindings", verb: "create"},
			{group: "rbac.authorization.k8s.io", resource: "clusterroles", verb: "escalate", name: "cluster-admin"},
			{group: "rbac.authorization.k8s.io", resource: "clusterroles", verb: "bind", name: "cluster-admin"},
			{resource: "users", verb: "impersonate", name: "admin"},
			{resource: "namespaces", verb: "delete", name: "kube-system"},
			{namespace: "kube-system", resource: "pods", subresource: "exec", verb: "create", name: "p"},
			{group: "apiextensions.k8s.io", resource: "customresourcedefinitions", verb: "update", name: "nstancemachinepools.infrastructure.cluster.x-k8s.io"},
		} {
			a.user = user
			require.False(t, allowed(t, e, a), "%s allowed: %s", user, a)
		}
	}
	for _, a := range []access{
		{namespace: "kube-system", resource: "secrets", verb: "get", name: "any"},
		{namespace: r.work(), resource: "secrets", verb: "list"},
	} {
		a.user = workload
		require.False(t, allowed(t, e, a), "%s allowed: %s", workload, a)
	}
	// The operator's Secret and token access ends at the managed namespace.
	for _, a := range []access{
		{namespace: "kube-system", resource: "secrets", verb: "get", name: "any"},
		{namespace: "kube-system", resource: "secrets", verb: "list"},
		{resource: "secrets", verb: "list"},
		{resource: "secrets", verb: "watch"},
		{namespace: "team-a", resource: "secrets", verb: "list"},
		{namespace: "team-a", resource: "secrets", verb: "create"},
		{namespace: "kube-system", resource: "serviceaccounts", subresource: "token", verb: "create", name: "default"},
	} {
		a.user = operator
		require.False(t, allowed(t, e, a), "%s allowed: %s", operator, a)
	}
}
