package importer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/ledger"
	"github.com/nstance-dev/nstance/internal/operator/metrics"
	"github.com/nstance-dev/nstance/internal/operator/paused"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
	"github.com/nstance-dev/nstance/internal/operator/watchfilter"
	"github.com/nstance-dev/nstance/internal/operator/webhook"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// ImportedAnnotation marks objects created by the import.
const ImportedAnnotation = "nstance.dev/imported"

// Importer imports server groups into Kubernetes.
type Importer struct {
	// Client writes objects; Reader reads straight from the API server.
	Client client.Client
	Reader client.Reader
	Conns  *shardconn.Manager
	Ledger *ledger.Ledger
	// Namespace receives the objects and holds the CAPI Cluster
	// ClusterName the MachinePools belong to.
	Namespace   string
	ClusterName string
	// WatchNamespace holds the pools and shard groups that make a group
	// known; empty means every namespace.
	WatchNamespace string
	// WatchFilter (--watch-filter) labels the pools and MachinePools the
	// import creates, so the operator that made them reconciles them.
	WatchFilter watchfilter.Filter
	Metrics     *metrics.Metrics
	Log         logr.Logger
	// Wait bounds how long to wait for each shard to be reachable; zero
	// means 30s. Groups only on shards still unreachable are not imported.
	Wait time.Duration
	// Workers creating objects in parallel; zero means 8.
	Workers int
}

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachinepools,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstanceshardgroups,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machinepools,verbs=get;list;watch;create

// Result reports what an import did.
type Result struct {
	Imported    []string
	Known       int
	Static      int
	Unreachable []string
}

// Run performs the import.
func (im *Importer) Run(ctx context.Context) (Result, error) {
	var res Result
	if err := im.waitCluster(ctx); err != nil {
		return res, err
	}
	wait := cmp.Or(im.Wait, 30*time.Second)
	found := map[string][]*nstancev1.GroupStatus{}
	for _, shard := range im.Conns.ShardIDs() {
		groups, err := im.listShard(ctx, shard, wait)
		if err != nil {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			im.Log.Error(err, "shard not imported", "shard", shard)
			res.Unreachable = append(res.Unreachable, shard)
			continue
		}
		for _, g := range groups {
			if g.GetStatic() {
				res.Static++
			}
			if g.GetShard() == "" {
				g.Shard = shard
			}
			id := g.GetSpec().GetGroupId()
			if id == "" {
				continue
			}
			found[id] = append(found[id], g)
		}
	}

	known, err := im.Ledger.Load(ctx, im.Reader)
	if err != nil {
		return res, err
	}
	var pools infrav1.NstanceMachinePoolList
	if err := im.Reader.List(ctx, &pools, client.InNamespace(im.WatchNamespace)); err != nil {
		return res, fmt.Errorf("list NstanceMachinePools: %w", err)
	}
	for _, p := range pools.Items {
		known[p.Spec.Group] = ledger.StateManaged
	}
	// A shard group without a pool (the machinedeployment cluster template
	// declares one for its NstanceMachines) also holds its group.
	var sgs infrav1.NstanceShardGroupList
	if err := im.Reader.List(ctx, &sgs, client.InNamespace(im.WatchNamespace)); err != nil {
		return res, fmt.Errorf("list NstanceShardGroups: %w", err)
	}
	for _, sg := range sgs.Items {
		known[sg.Spec.Group] = ledger.StateManaged
	}

	var todo []string
	for _, id := range slices.Sorted(maps.Keys(found)) {
		if _, ok := known[id]; ok {
			res.Known++
			continue
		}
		todo = append(todo, id)
	}
	imported, err := im.create(ctx, todo, found)
	res.Imported = imported
	if len(imported) > 0 {
		entries := make(map[string]string, len(imported))
		for _, id := range imported {
			entries[id] = ledger.StateManaged
		}
		if lerr := im.Ledger.RecordMany(ctx, entries); lerr != nil {
			err = errors.Join(err, lerr)
		}
	}
	im.Metrics.Imported(len(imported))
	im.Log.Info("startup import finished", "imported", len(imported), "alreadyKnown", res.Known, "static", res.Static, "unreachableShards", res.Unreachable)
	return res, err
}

func (im *Importer) listShard(ctx context.Context, shard string, wait time.Duration) ([]*nstancev1.GroupStatus, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := im.Conns.WaitReady(wctx, shard); err != nil {
		return nil, fmt.Errorf("shard %s not reachable within %s: %w", shard, wait, err)
	}
	c, err := im.Conns.Client(shard)
	if err != nil {
		return nil, err
	}
	resp, err := c.ListGroups(wctx, &nstancev1.ListGroupsRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListGroups on shard %s: %w", shard, err)
	}
	return resp.GetGroups(), nil
}

func (im *Importer) create(ctx context.Context, ids []string, found map[string][]*nstancev1.GroupStatus) ([]string, error) {
	workers := cmp.Or(im.Workers, 8)
	jobs := make(chan string)
	var (
		mu       sync.Mutex
		imported []string
		errs     []error
		wg       sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range jobs {
				err := im.createOne(ctx, id, found[id])
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					imported = append(imported, id)
				}
				mu.Unlock()
			}
		}()
	}
	for _, id := range ids {
		select {
		case jobs <- id:
		case <-ctx.Done():
		}
	}
	close(jobs)
	wg.Wait()
	slices.Sort(imported)
	return imported, errors.Join(errs...)
}

// waitCluster returns once the operator's Cluster exists and is not
// paused. Cluster objects are the user's, so the import waits for them: on
// a move target (clusterctl init, then clusterctl move) the Cluster arrives
// paused together with the pools and the ledger it brings, and once it
// resumes those groups are known; importing before would duplicate them.
func (im *Importer) waitCluster(ctx context.Context) error {
	var logged string
	return wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		cl, err := paused.ClusterNamed(ctx, im.Reader, im.Namespace, im.ClusterName)
		if err != nil {
			return false, err
		}
		why := ImportBlocked(cl)
		if why == "" {
			return true, nil
		}
		if why != logged {
			im.Log.Info("the import waits: "+why, "cluster", client.ObjectKey{Namespace: im.Namespace, Name: im.ClusterName})
			logged = why
		}
		return false, nil
	})
}

// ImportBlocked says why server groups cannot be imported for cluster (nil:
// it does not exist), or "" when they can.
func ImportBlocked(cluster *clusterv1.Cluster) string {
	switch {
	case cluster == nil:
		return "the Cluster does not exist yet"
	case !cluster.DeletionTimestamp.IsZero():
		return "the Cluster is being deleted"
	case paused.IsClusterPaused(cluster):
		return "the Cluster is paused"
	}
	return ""
}

// Objects builds the NstanceMachinePool and MachinePool for a group found on
// the given shards. Shards are ordered by size, largest first, so the even
// split gives the remainder back to the shards that had more. A static group
// (defined in a shard's config file) becomes a pool annotated
// webhook.StaticAnnotation: the webhook then refuses changes to its
// template, subnet pool, shards and its MachinePool's replicas, which the
// server would refuse anyway.
func Objects(namespace, clusterName, id string, groups []*nstancev1.GroupStatus) (*infrav1.NstanceMachinePool, *clusterv1.MachinePool) {
	groups = slices.Clone(groups)
	slices.SortFunc(groups, func(a, b *nstancev1.GroupStatus) int {
		if c := cmp.Compare(b.GetSpec().GetSize(), a.GetSpec().GetSize()); c != 0 {
			return c
		}
		return cmp.Compare(a.GetShard(), b.GetShard())
	})
	var total int32
	shards := make([]string, 0, len(groups))
	for _, g := range groups {
		total += int32(g.GetSpec().GetSize())
		shards = append(shards, g.GetShard())
	}
	spec := groups[0].GetSpec()
	labels := map[string]string{infrav1.GroupLabel: id}
	if clusterName != "" {
		labels[clusterv1.ClusterNameLabel] = clusterName
	}
	ann := map[string]string{ImportedAnnotation: "true"}
	static := slices.ContainsFunc(groups, (*nstancev1.GroupStatus).GetStatic)
	if static {
		ann[webhook.StaticAnnotation] = "true"
	}
	pool := &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: id, Labels: labels, Annotations: ann},
		Spec: infrav1.NstanceMachinePoolSpec{
			Group: id, Shards: shards, Template: spec.GetTemplate(), InstanceType: spec.GetInstanceType(),
			SubnetPool: spec.GetSubnetPool(), Vars: maps.Clone(spec.GetVars()), Image: spec.GetImage(),
		},
	}
	if len(pool.Spec.Vars) == 0 {
		pool.Spec.Vars = nil
	}
	if d := spec.GetDrainTimeout(); d != nil {
		pool.Spec.DrainTimeout = &metav1.Duration{Duration: d.AsDuration()}
	}
	mpLabels := maps.Clone(labels)
	if static {
		mpLabels[webhook.StaticLabel] = "true"
	}
	mp := &clusterv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: id, Labels: mpLabels, Annotations: maps.Clone(ann)},
		Spec: clusterv1.MachinePoolSpec{
			ClusterName:    clusterName,
			Replicas:       ptr.To(total),
			FailureDomains: slices.Clone(shards),
			Template: clusterv1.MachineTemplateSpec{
				Spec: clusterv1.MachineSpec{
					ClusterName: clusterName,
					// Instances bootstrap through nstance-agent; no bootstrap
					// data Secret is needed.
					Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To("")},
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachinePool", Name: id,
					},
				},
			},
		},
	}
	return pool, mp
}

func (im *Importer) createOne(ctx context.Context, id string, groups []*nstancev1.GroupStatus) error {
	pool, mp := Objects(im.Namespace, im.ClusterName, id, groups)
	im.WatchFilter.Stamp(pool)
	im.WatchFilter.Stamp(mp)
	// Created with the finalizer its controller would add first: one write
	// (and one reconcile) less per pool at start-up.
	controllerutil.AddFinalizer(pool, infrav1.MachinePoolFinalizer)
	if err := im.Client.Create(ctx, pool); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("import group %s: an NstanceMachinePool named %s already exists for another group", id, id)
		}
		return fmt.Errorf("import group %s: create NstanceMachinePool: %w", id, err)
	}
	if err := im.Client.Create(ctx, mp); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("import group %s: create MachinePool: %w", id, err)
	}
	im.Log.Info("imported group", "group", id, "shards", pool.Spec.Shards, "replicas", *mp.Spec.Replicas,
		"static", webhook.IsStatic(pool))
	return nil
}
