package ledger

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// DefaultName is the ConfigMap name.
const DefaultName = "nstance-operator-groups"

// Group states recorded in the ledger.
const (
	StateManaged = "managed"
	StateDeleted = "deleted"
	// StateOrphaned marks a group left on one shard without DeleteGroup:
	// the shard was removed from the operator configuration, or its
	// deletion was abandoned while the shard was unreachable. Its key is
	// OrphanKey(group, shard); the group is deleted on that shard when the
	// shard is configured and reachable again (see Orphans).
	StateOrphaned = "orphaned"
)

// Orphan is a group left on a shard (StateOrphaned).
type Orphan struct {
	Group, Shard string
}

// OrphanKey is the ledger key of group orphaned on shard: the shard
// group's name, which no group ID can equal (group IDs cannot contain the
// separator), so the import never takes it for a group.
func OrphanKey(group, shard string) string { return infrav1.ShardGroupName(group, shard) }

// Orphans returns the orphaned groups among entries (as Load returns
// them), sorted by shard, then group.
func Orphans(entries map[string]string) []Orphan {
	var out []Orphan
	for k, v := range entries {
		if v != StateOrphaned {
			continue
		}
		if g, s, ok := infrav1.ParseShardGroupName(k); ok {
			out = append(out, Orphan{Group: g, Shard: s})
		}
	}
	slices.SortFunc(out, func(a, b Orphan) int {
		return cmp.Or(cmp.Compare(a.Shard, b.Shard), cmp.Compare(a.Group, b.Group))
	})
	return out
}

// Groups returns the group IDs among entries (managed or deleted; orphan
// keys are not group IDs), sorted.
func Groups(entries map[string]string) []string {
	var out []string
	for k, v := range entries {
		if v == StateManaged || v == StateDeleted {
			if _, _, orphan := infrav1.ParseShardGroupName(k); !orphan {
				out = append(out, k)
			}
		}
	}
	slices.Sort(out)
	return out
}

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

// RecordOrphan records that group was left on shard (StateOrphaned).
func (l *Ledger) RecordOrphan(ctx context.Context, group, shard string) error {
	return l.Record(ctx, OrphanKey(group, shard), StateOrphaned)
}

// ForgetOrphan removes the record of group orphaned on shard, once the
// group is deleted there.
func (l *Ledger) ForgetOrphan(ctx context.Context, group, shard string) error {
	key := OrphanKey(group, shard)
	body, err := json.Marshal(map[string]any{"data": map[string]any{key: nil}})
	if err != nil {
		return fmt.Errorf("encode ledger patch: %w", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name}}
	if err := l.Client.Patch(ctx, cm, client.RawPatch(types.MergePatchType, body)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("forget orphaned group %s on shard %s in ConfigMap %s/%s: %w", group, shard, l.Namespace, l.Name, err)
	}
	l.mu.Lock()
	delete(l.seen, key)
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
