package workload

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// Mode says where the Nodes and Pods of the workload cluster live.
type Mode string

const (
	// InCluster: the operator runs in the workload cluster itself; Nodes,
	// Pods and evictions use the operator's own client. The default.
	InCluster Mode = "in-cluster"
	// Management: the operator runs in a management cluster; Nodes, Pods and
	// evictions go to the cluster of the <cluster>-kubeconfig Secret.
	Management Mode = "management"
)

// Modes lists the valid modes.
func Modes() []Mode { return []Mode{InCluster, Management} }

// ParseMode accepts "in-cluster" and "management"; empty means InCluster.
func ParseMode(s string) (Mode, error) {
	switch Mode(strings.TrimSpace(s)) {
	case "", InCluster:
		return InCluster, nil
	case Management:
		return Management, nil
	}
	return "", fmt.Errorf("%q: want %s or %s", s, InCluster, Management)
}

// NodeProviderIDIndex indexes Nodes by spec.providerID in the cache of
// every workload cluster.
const NodeProviderIDIndex = "spec.providerID"

// NodeProviderID is the index function of NodeProviderIDIndex.
func NodeProviderID(o client.Object) []string {
	if id := o.(*corev1.Node).Spec.ProviderID; id != "" {
		return []string{id}
	}
	return nil
}

// ErrUnreachable wraps every error of Access.Cluster: the workload cluster
// cannot be used right now (no kubeconfig Secret yet, API server down, health
// probe failing). Callers wait and retry; nothing about the cluster's Nodes
// may be concluded from it.
var ErrUnreachable = errors.New("workload cluster unreachable")

// Cluster is one workload cluster as the drain and on-demand controllers use
// it. Its clients stay valid for one reconcile; get a fresh one each time.
type Cluster struct {
	// Client reads Nodes (indexed by NodeProviderIDIndex) and Pods from a
	// cache and writes.
	Client client.Client
	// Reader reads from the API server (Pods of a Node by field selector).
	Reader client.Reader
	// Policy posts evictions with no client-side retry (a
	// PodDisruptionBudget refusal comes back at once as 429).
	Policy rest.Interface
	// Recorder records core/v1 Events about Nodes and Pods in this cluster.
	Recorder record.EventRecorder
	// Local is true when this is the operator's own cluster, so objects of
	// the operator may carry owner references to its Pods.
	Local bool
}

// Access hands out workload clusters.
type Access interface {
	// Cluster returns the workload cluster of the Cluster API Cluster key,
	// or an error wrapping ErrUnreachable.
	Cluster(ctx context.Context, key client.ObjectKey) (*Cluster, error)
	// Watch sends events about kind in the workload cluster of key to ctl,
	// for as long as the operator runs (in management mode again after every
	// reconnection). name identifies the watch.
	Watch(key client.ObjectKey, ctl controller.Controller, name string, kind client.Object, h handler.EventHandler, preds ...predicate.Predicate) error
	// Mode is the mode of this access.
	Mode() Mode
}
