package attack

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// The on-demand cases run a Kubernetes API (dev-k8s) and the real
// nstance-operator, registered with dev-1 as an operator of tenant A, beside
// the stack. Pods are created the way anyone allowed to create a Pod would;
// what launched is read from the server with tenant A's operator connection.
const (
	// odNamespace is the operator's namespace (NSTANCE_NAMESPACE).
	odNamespace = "nstance-system"
	// odAttackerNamespace is a namespace of the workload cluster where an
	// attacker may create pods.
	odAttackerNamespace = "team-x"
	// Groups of tenant A on dev-1, imported by the operator as pools:
	// od-open opts into on-demand pods, od-closed does not, od-quota opts
	// in with room for one.
	odOpen   = "od-open"
	odClosed = "od-closed"
	odQuota  = "od-quota"
	// odRefusedReason is the reason of the Event on a refused pod.
	odRefusedReason = "OnDemandRefused"
	// Pod annotations of internal/operator/ondemand.
	odAnnGroup = "on-demand.nstance.dev/group"
	odAnnType  = "on-demand.nstance.dev/instance-type"
)

var nstancePoolGVK = schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta1", Kind: "NstanceMachinePool"}

// onDemandStack is started by the first on-demand case that runs and kept
// for the others (the cases of onDemandCases share one).
type onDemandStack struct {
	mu      sync.Mutex
	started bool
	err     error
	k8s     client.Client
}

// start brings up dev-k8s and the operator once; a failed start fails every
// later case with the same error.
func (od *onDemandStack) start(ctx context.Context, e *env) error {
	od.mu.Lock()
	defer od.mu.Unlock()
	if !od.started {
		od.started = true
		// The build takes what it takes on a loaded machine (the test's
		// own timeout bounds it); starting then gets its own deadline,
		// longer than one case's budget.
		if _, err := bins.Build("dev-k8s", "nstance-operator"); err != nil {
			od.err = err
			return err
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
		defer cancel()
		od.err = od.up(sctx, e)
		if od.err != nil {
			od.err = fmt.Errorf("starting dev-k8s and the operator: %w", od.err)
		}
	}
	return od.err
}

func (od *onDemandStack) up(ctx context.Context, e *env) error {
	s := e.s
	// Tenant A's groups, before the operator starts: its startup import
	// turns them into NstanceMachinePools.
	a := nstancev1.NewOperatorServiceClient(e.connA)
	for _, g := range []string{odOpen, odClosed, odQuota} {
		if _, err := a.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: g, Template: "svc", Size: 0}}); err != nil {
			return fmt.Errorf("tenant A creating group %s: %w", g, err)
		}
	}
	crds, err := proctest.CRDDirs(ctx, s.root)
	if err != nil {
		return err
	}
	dir := filepath.Join(s.dir, "dev-k8s")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	args := []string{"--addr", portpick.Addr(s.t), "--dir", dir, "--log-level", "warn"}
	for _, d := range crds {
		args = append(args, "--crd-dir", d)
	}
	k8s, err := s.procs.Start("dev-k8s", "dev-k8s", nil, args...)
	if err != nil {
		return err
	}
	if err := k8s.WaitFor(ctx, "dev-k8s kubeconfig", 30*time.Second, func() bool { return proctest.Exists(kubeconfig) }); err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if od.k8s, err = client.New(rc, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	if err := proctest.Wait(ctx, "dev-k8s serving", 30*time.Second, func() bool {
		return od.k8s.List(ctx, &corev1.NamespaceList{}) == nil
	}); err != nil {
		return err
	}
	caPEM, err := s.get(ctx, s.keys.CACert())
	if err != nil {
		return err
	}
	tok, err := e.l.mintNonce(nonce.KindOperator, tenantA, "op-ondemand", "", time.Hour)
	if err != nil {
		return err
	}
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: odNamespace}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: odAttackerNamespace}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: odNamespace, Name: "nstance-cluster-ca"}, Data: map[string]string{"ca.crt": string(caPEM)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: odNamespace, Name: "nstance-operator-nonce"}, Data: map[string][]byte{"nonce.jwt": []byte(tok)}},
	} {
		if err := od.k8s.Create(ctx, o); err != nil {
			return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	// The Cluster is the user's: the operator imports groups only into an
	// existing, unpaused Cluster named after its cluster id.
	for _, o := range []map[string]any{
		{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "NstanceCluster",
			"metadata": map[string]any{"name": clusterID, "namespace": odNamespace, "labels": map[string]any{"cluster.x-k8s.io/cluster-name": clusterID}},
			"spec":     map[string]any{}},
		{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
			"metadata": map[string]any{"name": clusterID, "namespace": odNamespace},
			"spec":     map[string]any{"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "NstanceCluster", "name": clusterID}}},
	} {
		u := &unstructured.Unstructured{Object: o}
		if err := od.k8s.Create(ctx, u); err != nil {
			return fmt.Errorf("creating %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	cfgPath := filepath.Join(s.dir, "operator", "config.yaml")
	cfg := proctest.OperatorConfig(clusterID, tenantA, proctest.OperatorShard{Name: e.dev1.shard, Registration: e.dev1.registration, Operator: e.dev1.operator})
	if err := proctest.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return err
	}
	op, err := s.procs.Start("nstance-operator", "nstance-operator", []string{"NSTANCE_NAMESPACE=" + odNamespace, "NSTANCE_K8S_JSON=true"},
		"--kubeconfig", kubeconfig, "--config", cfgPath, "--health-probe-bind-address", portpick.Addr(s.t),
		"--disable-webhooks", "--join-timeout", "0", "--log-format", "json")
	if err != nil {
		return err
	}
	// Registered, connected and imported: the three groups are pools.
	if err := op.WaitFor(ctx, "the operator importing tenant A's groups as NstanceMachinePools", 120*time.Second, func() bool {
		for _, g := range []string{odOpen, odClosed, odQuota} {
			p := &unstructured.Unstructured{}
			p.SetGroupVersionKind(nstancePoolGVK)
			if od.k8s.Get(ctx, client.ObjectKey{Namespace: odNamespace, Name: g}, p) != nil {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	// What an administrator opts in (an old operator's CRD prunes the
	// field; its operator ignored it anyway).
	for g, spec := range map[string]string{
		odOpen:  `{"enabled":true,"maxInstances":10}`,
		odQuota: `{"enabled":true,"maxInstances":1}`,
	} {
		p := &unstructured.Unstructured{}
		p.SetGroupVersionKind(nstancePoolGVK)
		p.SetNamespace(odNamespace)
		p.SetName(g)
		if err := od.k8s.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"onDemand":`+spec+`}}`))); err != nil {
			return fmt.Errorf("opting pool %s in: %w", g, err)
		}
	}
	return nil
}

// instances returns tenant A's live (not deleted) instances of group on
// dev-1, as its operator sees them.
func odInstances(ctx context.Context, e *env, group string) ([]string, error) {
	resp, err := nstancev1.NewOperatorServiceClient(e.connA).ListInstances(ctx, &nstancev1.ListInstancesRequest{GroupIds: []string{group}})
	if err != nil {
		return nil, fmt.Errorf("ListInstances of %s: %w", group, err)
	}
	var ids []string
	for _, i := range resp.Instances {
		if i.State != nstancev1.InstanceState_INSTANCE_STATE_DELETED {
			ids = append(ids, i.InstanceId)
		}
	}
	return ids, nil
}

// createPod creates an annotated pod as an attacker (or a user) would.
func (od *onDemandStack) createPod(ctx context.Context, ns string, annotations map[string]string) (*corev1.Pod, error) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "od-attack-", Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/job"}}},
	}
	if err := od.k8s.Create(ctx, pod); err != nil {
		return nil, fmt.Errorf("creating a pod in %s: %w", ns, err)
	}
	return pod, nil
}

// refusal returns the OnDemandRefused Event on pod, if any.
func (od *onDemandStack) refusal(ctx context.Context, pod *corev1.Pod) (*corev1.Event, error) {
	var evs corev1.EventList
	if err := od.k8s.List(ctx, &evs, client.InNamespace(pod.Namespace)); err != nil {
		return nil, err
	}
	for i := range evs.Items {
		ev := &evs.Items[i]
		if ev.InvolvedObject.UID == pod.UID && ev.Reason == odRefusedReason {
			return ev, nil
		}
	}
	return nil, nil
}

// waitLaunch waits until group has more than before instances.
func waitLaunch(ctx context.Context, e *env, group string, before int, timeout time.Duration) ([]string, error) {
	var ids []string
	var lastErr error
	err := proctest.Wait(ctx, fmt.Sprintf("an instance of %s launched", group), timeout, func() bool {
		ids, lastErr = odInstances(ctx, e, group)
		return lastErr == nil && len(ids) > before
	})
	return ids, errors.Join(err, lastErr)
}

// expectRefused creates a pod and requires that it is refused with an Event
// whose message contains want, and that group gets no instance.
func (od *onDemandStack) expectRefused(ctx context.Context, e *env, ns, group string, annotations map[string]string, want string) error {
	before, err := odInstances(ctx, e, group)
	if err != nil {
		return err
	}
	pod, err := od.createPod(ctx, ns, annotations)
	if err != nil {
		return err
	}
	defer func() { _ = od.k8s.Delete(context.WithoutCancel(ctx), pod) }()
	var ev *corev1.Event
	var launched []string
	var lastErr error
	werr := proctest.Wait(ctx, "the pod refused or an instance launched", 45*time.Second, func() bool {
		if launched, lastErr = odInstances(ctx, e, group); lastErr != nil || len(launched) > len(before) {
			return true
		}
		ev, lastErr = od.refusal(ctx, pod)
		return lastErr != nil || ev != nil
	})
	switch {
	case lastErr != nil:
		return lastErr
	case len(launched) > len(before):
		return fmt.Errorf("pod %s/%s launched an instance of group %s: %d instances before, now %v", ns, pod.Name, group, len(before), launched)
	case werr != nil:
		return fmt.Errorf("pod %s/%s: no %s Event and no instance: %w", ns, pod.Name, odRefusedReason, werr)
	case !strings.Contains(ev.Message, want):
		return fmt.Errorf("pod %s/%s refused, but not for %q: %s", ns, pod.Name, want, ev.Message)
	case ev.Type != corev1.EventTypeWarning:
		return fmt.Errorf("refusal Event of type %s, want Warning", ev.Type)
	}
	// Nothing launched after the refusal either, nor a Machine waiting.
	if now, err := odInstances(ctx, e, group); err != nil || len(now) > len(before) {
		return errors.Join(err, fmt.Errorf("instances of %s after the refusal: %v (before: %d)", group, now, len(before)))
	}
	nm := &unstructured.Unstructured{}
	nm.SetGroupVersionKind(schema.GroupVersionKind{Group: nstancePoolGVK.Group, Version: nstancePoolGVK.Version, Kind: "NstanceMachine"})
	if err := od.k8s.Get(ctx, client.ObjectKey{Namespace: odNamespace, Name: "od-" + string(pod.UID)}, nm); !apierrors.IsNotFound(err) {
		return fmt.Errorf("NstanceMachine od-%s of the refused pod: %v", pod.UID, err)
	}
	return nil
}
