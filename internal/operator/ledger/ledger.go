package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DefaultName is the ConfigMap name.
const DefaultName = "nstance-operator-groups"

// Group states recorded in the ledger.
const (
	StateManaged = "managed"
	StateDeleted = "deleted"
)

// Ledger reads and writes the ConfigMap. Writes go straight to the API
// server; a small in-memory set avoids repeating them.
type Ledger struct {
	Client    client.Client
	Namespace string
	Name      string

	mu   sync.Mutex
	seen map[string]string
}

// New returns a ledger stored in namespace/name (name defaults to DefaultName).
func New(c client.Client, namespace, name string) *Ledger {
	if name == "" {
		name = DefaultName
	}
	return &Ledger{Client: c, Namespace: namespace, Name: name, seen: map[string]string{}}
}

// Record marks group with state (StateManaged or StateDeleted).
func (l *Ledger) Record(ctx context.Context, group, state string) error {
	l.mu.Lock()
	if l.seen[group] == state {
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	return l.RecordMany(ctx, map[string]string{group: state})
}

// RecordMany writes several entries in one patch.
func (l *Ledger) RecordMany(ctx context.Context, entries map[string]string) error {
	if len(entries) == 0 {
		return nil
	}
	// The move label makes clusterctl move carry the ledger with the
	// cluster's objects (it owns none and no Cluster owns it).
	body, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"labels": map[string]string{clusterctlv1.ClusterctlMoveLabel: ""}},
		"data":     entries,
	})
	if err != nil {
		return fmt.Errorf("encode ledger patch: %w", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name}}
	err = l.Client.Patch(ctx, cm, client.RawPatch(types.MergePatchType, body))
	if apierrors.IsNotFound(err) {
		cm.Data = entries
		cm.Labels = map[string]string{clusterctlv1.ClusterctlMoveLabel: ""}
		err = l.Client.Create(ctx, cm)
		if apierrors.IsAlreadyExists(err) {
			err = l.Client.Patch(ctx, cm, client.RawPatch(types.MergePatchType, body))
		}
	}
	if err != nil {
		return fmt.Errorf("record groups in ConfigMap %s/%s: %w", l.Namespace, l.Name, err)
	}
	l.mu.Lock()
	for g, s := range entries {
		l.seen[g] = s
	}
	l.mu.Unlock()
	return nil
}

// Load returns every recorded group and its state, reading from r (use an
// uncached reader at startup).
func (l *Ledger) Load(ctx context.Context, r client.Reader) (map[string]string, error) {
	var cm corev1.ConfigMap
	if err := r.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: l.Name}, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return map[string]string{}, nil
		}
		return nil, fmt.Errorf("read ConfigMap %s/%s: %w", l.Namespace, l.Name, err)
	}
	out := make(map[string]string, len(cm.Data))
	for k, v := range cm.Data {
		out[k] = v
	}
	l.mu.Lock()
	for k, v := range out {
		l.seen[k] = v
	}
	l.mu.Unlock()
	return out, nil
}
