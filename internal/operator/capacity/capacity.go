package capacity

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// GPUResource is the resource name of NVIDIA GPUs on a node.
const GPUResource corev1.ResourceName = "nvidia.com/gpu"

// Of converts a server's description of an instance type into the status
// fields: whole CPUs and pods as decimal counts, memory and ephemeral
// storage in binary units (MiB and GiB exactly), GPUs only when the type
// has some, ephemeral storage only when the type has its own.
func Of(it *nstancev1.InstanceTypeInfo) (corev1.ResourceList, infrav1.NodeInfo) {
	rl := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(it.GetVcpus()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(it.GetMemoryMib()<<20, resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(int64(it.GetPods()), resource.DecimalSI),
	}
	if s := it.GetEphemeralStorageGib(); s > 0 {
		rl[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(s<<30, resource.BinarySI)
	}
	if g := it.GetGpus(); g > 0 {
		rl[GPUResource] = *resource.NewQuantity(int64(g), resource.DecimalSI)
	}
	return rl, infrav1.NodeInfo{Architecture: infrav1.Architecture(it.GetArchitecture()), OperatingSystem: it.GetOperatingSystem()}
}

// Describer is one shard server's DescribeInstanceType.
type Describer interface {
	Describe(ctx context.Context, shard string, req *nstancev1.DescribeInstanceTypeRequest) (*nstancev1.InstanceTypeInfo, error)
}

// Lookup is what to describe: a template and/or an instance type (the
// instance type wins; empty asks for the template's).
type Lookup struct {
	Template, InstanceType string
}

func (l Lookup) empty() bool { return l.Template == "" && l.InstanceType == "" }

// DefaultTTL is how long Catalog keeps an answer: a changed catalog entry
// reaches the objects within it.
const DefaultTTL = 10 * time.Minute

// Catalog asks the shards, in the order given, until one answers, and
// caches answers per shard and lookup for TTL (apimachinery's expiring
// cache). Safe for concurrent use.
type Catalog struct {
	Shards Describer
	TTL    time.Duration
	// Clock ages the cache; nil means the real clock.
	Clock clock.Clock

	once  sync.Once
	cache *cache.Expiring
}

type cacheKey struct {
	shard string
	Lookup
}

// Describe returns the first answer of shards (cached or fresh). With
// every shard failing it returns their errors joined.
func (c *Catalog) Describe(ctx context.Context, shards []string, l Lookup) (*nstancev1.InstanceTypeInfo, error) {
	ttl := c.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	c.once.Do(func() { c.cache = cache.NewExpiringWithClock(cmp.Or[clock.Clock](c.Clock, clock.RealClock{})) })
	var errs []error
	for _, shard := range shards {
		k := cacheKey{shard, l}
		if v, ok := c.cache.Get(k); ok {
			return v.(*nstancev1.InstanceTypeInfo), nil
		}
		info, err := c.Shards.Describe(ctx, shard, &nstancev1.DescribeInstanceTypeRequest{Template: l.Template, InstanceType: l.InstanceType})
		if err != nil {
			errs = append(errs, fmt.Errorf("shard %s: %w", shard, err))
			continue
		}
		c.cache.Set(k, info, ttl)
		return info, nil
	}
	if len(errs) == 0 {
		return nil, errors.New("no shard to ask")
	}
	return nil, fmt.Errorf("describe instance type (template %q, instance type %q): %w", l.Template, l.InstanceType, errors.Join(errs...))
}

// SetPool sets the pool's status.capacity and status.nodeInfo from its
// shards (spec.template, spec.instanceType). When no shard answers, or the
// pool names neither, it keeps what the pool had and logs why: the
// autoscaler keeps its last view rather than losing the pool. A nil
// catalog does nothing.
func SetPool(ctx context.Context, c *Catalog, pool *infrav1.NstanceMachinePool) {
	if c == nil {
		return
	}
	l := Lookup{Template: pool.Spec.Template, InstanceType: pool.Spec.InstanceType}
	if l.empty() {
		return
	}
	info, err := c.Describe(ctx, pool.Spec.Shards, l)
	if err != nil {
		ctrl.LoggerFrom(ctx).Info("pool capacity not published", "error", err.Error())
		return
	}
	pool.Status.Capacity, pool.Status.NodeInfo = Of(info)
}

// SetTemplate does the same for a machine template: its machines' shard
// when it names one, else any of shards.
func SetTemplate(ctx context.Context, c *Catalog, t *infrav1.NstanceMachineTemplate, shards []string) error {
	spec := t.Spec.Template.Spec
	l := Lookup{Template: spec.Template, InstanceType: spec.InstanceType}
	if l.empty() {
		return nil
	}
	if spec.Shard != "" {
		shards = []string{spec.Shard}
	}
	info, err := c.Describe(ctx, shards, l)
	if err != nil {
		return err
	}
	t.Status.Capacity, t.Status.NodeInfo = Of(info)
	return nil
}
