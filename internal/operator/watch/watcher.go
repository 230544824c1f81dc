package watch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/metrics"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Stream names used in logs and metrics.
const (
	StreamGroups = "groups"
	StreamErrors = "errors"
)

// Event reasons for server errors, by source.
const (
	EventProviderError  = "ProviderError"
	EventConfigError    = "ConfigError"
	EventReconcileError = "ReconcileError"
)

// Watcher runs WatchGroups and WatchErrors for every shard.
type Watcher struct {
	Conns    *shardconn.Manager
	Cache    *Cache
	Client   client.Client
	Recorder events.EventRecorder
	// Namespace holds the shard groups and pools; empty means every
	// namespace.
	Namespace string
	// ClusterNamespace and ClusterName name the NstanceCluster that
	// receives Events for errors not tied to a group.
	ClusterNamespace, ClusterName string
	// Trigger receives shard groups to reconcile; sends block, never drop.
	Trigger chan<- event.GenericEvent
	Metrics *metrics.Metrics
	Log     logr.Logger
	// MaxBackoff caps the delay between stream attempts; zero means 5s.
	MaxBackoff time.Duration
}

// Start launches the stream loops; they stop when ctx ends.
func (w *Watcher) Start(ctx context.Context) {
	for _, shard := range w.Conns.ShardIDs() {
		go w.loop(ctx, shard, StreamGroups, w.groupsOnce)
		go w.loop(ctx, shard, StreamErrors, w.errorsOnce)
	}
}

// loop keeps one stream open, reopening it with jittered exponential
// backoff (streamloop) and counting each reopening.
func (w *Watcher) loop(ctx context.Context, shard, stream string, once func(context.Context, string) error) {
	w.Conns.Follow(ctx, shard, stream, w.MaxBackoff, w.Log, func() { w.Metrics.StreamReconnected(shard, stream) }, func(ctx context.Context) error {
		err := once(ctx, shard)
		if stream == StreamGroups && ctx.Err() == nil {
			w.Cache.Unsync(shard)
		}
		return err
	})
}

// groupsOnce opens WatchGroups, resyncs the whole shard with ListGroups and
// then applies events until the stream breaks.
func (w *Watcher) groupsOnce(ctx context.Context, shard string) error {
	c, err := w.Conns.Client(shard)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.WatchGroups(sctx, &nstancev1.WatchGroupsRequest{})
	if err != nil {
		return fmt.Errorf("open WatchGroups: %w", err)
	}
	// The server sends headers once the subscription is in place, so the
	// list below cannot miss a change.
	if _, err := stream.Header(); err != nil {
		return fmt.Errorf("WatchGroups headers: %w", err)
	}
	list, err := c.ListGroups(sctx, &nstancev1.ListGroupsRequest{})
	if err != nil {
		return fmt.Errorf("ListGroups: %w", err)
	}
	w.Cache.Replace(shard, list.GetGroups())
	w.Log.V(1).Info("shard resynced", "shard", shard, "groups", len(list.GetGroups()))
	if err := w.triggerShard(ctx, shard); err != nil {
		return err
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("server closed the stream")
			}
			return err
		}
		id := ev.GetGroupId()
		switch ev.GetType() {
		case nstancev1.GroupEventType_GROUP_EVENT_TYPE_UPSERT:
			if ev.GetGroup() == nil {
				continue
			}
			w.Cache.Put(shard, ev.GetGroup())
			if id == "" {
				id = ev.GetGroup().GetSpec().GetGroupId()
			}
		case nstancev1.GroupEventType_GROUP_EVENT_TYPE_DELETE:
			w.Cache.Delete(shard, id)
		default:
			continue
		}
		if id != "" {
			w.trigger(ctx, id, shard)
		}
	}
}

func (w *Watcher) trigger(ctx context.Context, group, shard string) {
	sgs, err := ShardGroups(ctx, w.Client, w.Namespace, group, shard)
	if err != nil {
		w.Log.Error(err, "find shard groups to requeue", "group", group, "shard", shard)
		return
	}
	for i := range sgs {
		w.send(ctx, &sgs[i])
	}
}

func (w *Watcher) send(ctx context.Context, sg *infrav1.NstanceShardGroup) {
	key := &infrav1.NstanceShardGroup{}
	key.Namespace, key.Name = sg.Namespace, sg.Name
	select {
	case w.Trigger <- event.GenericEvent{Object: key}:
	case <-ctx.Done():
	}
}

func (w *Watcher) triggerShard(ctx context.Context, shard string) error {
	var list infrav1.NstanceShardGroupList
	if err := w.Client.List(ctx, &list, client.InNamespace(w.Namespace), client.MatchingLabels{infrav1.ShardLabel: shard}); err != nil {
		return fmt.Errorf("list shard groups of shard %s: %w", shard, err)
	}
	for i := range list.Items {
		w.send(ctx, &list.Items[i])
	}
	return nil
}

// ShardGroupIndex indexes NstanceShardGroups by "{group}/{shard}".
const ShardGroupIndex = "nstance.dev/group-shard"

// SetupIndexes registers ShardGroupIndex with the manager's cache.
func SetupIndexes(ctx context.Context, indexer client.FieldIndexer) error {
	if err := indexer.IndexField(ctx, &infrav1.NstanceShardGroup{}, ShardGroupIndex, func(o client.Object) []string {
		sg, ok := o.(*infrav1.NstanceShardGroup)
		if !ok || sg.Spec.Group == "" || sg.Spec.Shard == "" {
			return nil
		}
		return []string{sg.Spec.Group + "/" + sg.Spec.Shard}
	}); err != nil {
		return fmt.Errorf("index NstanceShardGroups by group and shard: %w", err)
	}
	return nil
}

// ShardGroups returns the NstanceShardGroups of group on shard in namespace
// (empty: every namespace), through ShardGroupIndex. Normally there is one;
// pools of several namespaces naming one group would give more.
func ShardGroups(ctx context.Context, r client.Reader, namespace, group, shard string) ([]infrav1.NstanceShardGroup, error) {
	var list infrav1.NstanceShardGroupList
	if err := r.List(ctx, &list, client.InNamespace(namespace), client.MatchingFields{ShardGroupIndex: group + "/" + shard}); err != nil {
		return nil, fmt.Errorf("list shard groups of group %s on shard %s: %w", group, shard, err)
	}
	return list.Items, nil
}

// errorsOnce forwards WatchErrors events as Kubernetes Events.
func (w *Watcher) errorsOnce(ctx context.Context, shard string) error {
	c, err := w.Conns.Client(shard)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.WatchErrors(sctx, &nstancev1.WatchErrorsRequest{})
	if err != nil {
		return fmt.Errorf("open WatchErrors: %w", err)
	}
	if _, err := stream.Header(); err != nil {
		return fmt.Errorf("WatchErrors headers: %w", err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("server closed the stream")
			}
			return err
		}
		if err := w.RecordError(ctx, shard, ev); err != nil {
			w.Log.Error(err, "recording server error as an Event", "shard", shard)
		}
	}
}

// RecordError emits a Warning Event for a server error on the shard group
// of its group and on that group's pool, or on the NstanceCluster when the
// error names no known group.
func (w *Watcher) RecordError(ctx context.Context, shard string, ev *nstancev1.ErrorEvent) error {
	reason := EventReconcileError
	switch ev.GetSource() {
	case nstancev1.ErrorSource_ERROR_SOURCE_PROVIDER:
		reason = EventProviderError
	case nstancev1.ErrorSource_ERROR_SOURCE_CONFIG:
		reason = EventConfigError
	}
	if ev.GetShard() != "" {
		shard = ev.GetShard()
	}
	note := fmt.Sprintf("shard %s: %s", shard, ev.GetMessage())
	if ev.GetInstanceId() != "" {
		note = fmt.Sprintf("shard %s, instance %s: %s", shard, ev.GetInstanceId(), ev.GetMessage())
	}
	var targets []runtime.Object
	if g := ev.GetGroupId(); g != "" {
		sgs, err := ShardGroups(ctx, w.Client, w.Namespace, g, shard)
		if err != nil {
			return err
		}
		for i := range sgs {
			sg := &sgs[i]
			targets = append(targets, sg)
			if ref := metav1.GetControllerOf(sg); ref != nil && ref.Kind == "NstanceMachinePool" {
				var pool infrav1.NstanceMachinePool
				if err := w.Client.Get(ctx, client.ObjectKey{Namespace: sg.Namespace, Name: ref.Name}, &pool); err == nil {
					targets = append(targets, &pool)
				}
			}
		}
	}
	if len(targets) == 0 && w.ClusterName != "" {
		var nc infrav1.NstanceCluster
		if err := w.Client.Get(ctx, client.ObjectKey{Namespace: cmp.Or(w.ClusterNamespace, w.Namespace), Name: w.ClusterName}, &nc); err == nil {
			targets = append(targets, &nc)
		} else if !apierrors.IsNotFound(err) {
			return fmt.Errorf("get NstanceCluster: %w", err)
		}
	}
	if len(targets) == 0 {
		w.Log.Error(errors.New(ev.GetMessage()), "server error with no object to attach an Event to", "shard", shard, "group", ev.GetGroupId(), "source", ev.GetSource().String())
		return nil
	}
	for _, t := range targets {
		w.Recorder.Eventf(t, nil, corev1.EventTypeWarning, reason, "Reconcile", "%s", note)
	}
	return nil
}
