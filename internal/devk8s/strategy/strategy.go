package strategy

import (
	"github.com/go-logr/logr"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
)

// Strategy is what every resource does on top of the generic handling of
// objects (server-managed metadata, status/spec split, generation, typed
// round trip). Built-in objects only: the apiserver applies custom
// resources' CRD schemas itself, and Generic does nothing.
type Strategy interface {
	// Default applies the defaults kube-apiserver sets whenever it
	// decodes an object (create, update and patch alike), before the
	// typed round trip.
	Default(res *registry.Resource, obj map[string]any)
	// PrepareForCreate sets what a new object starts with beyond the
	// generic server-managed fields (an initial status, say).
	PrepareForCreate(res *registry.Resource, obj map[string]any)
	// PrepareForUpdate prepares next, written through the main resource
	// over cur, before the generic part keeps the status and compares
	// specs; true bumps metadata.generation even with an equal spec.
	PrepareForUpdate(res *registry.Resource, cur, next map[string]any) (bumpGeneration bool)
	// Validate checks a new (old nil) or updated object after the typed
	// round trip.
	Validate(res *registry.Resource, old, obj map[string]any) error
}

// BuiltIn is a Strategy that also declares its resource.
type BuiltIn interface {
	Strategy
	// Resource is the registry entry of the resource.
	Resource() registry.Resource
}

// Builtins lists the built-in resources, in the order discovery shows
// them (the core group first).
func Builtins() []BuiltIn {
	return []BuiltIn{
		Namespaces{}, Nodes{}, Pods{}, Secrets{}, ConfigMaps{}, ServiceAccounts{}, Events{}, Services{}, LimitRanges{},
		CSINodes{}, CSIDrivers{}, RuntimeClasses{}, Leases{}, PodDisruptionBudgets{},
		Deployments{}, ReplicaSets{}, StatefulSets{}, DaemonSets{}, CustomResourceDefinitions{},
	}
}

// Resources returns the registry entries of Builtins.
func Resources() []registry.Resource {
	var out []registry.Resource
	for _, b := range Builtins() {
		out = append(out, b.Resource())
	}
	return out
}

// Generic is the strategy of custom resources and of built-ins with no
// rules of their own; built-in strategies embed it.
type Generic struct{}

// Default does nothing.
func (Generic) Default(*registry.Resource, map[string]any) {}

// PrepareForCreate does nothing.
func (Generic) PrepareForCreate(*registry.Resource, map[string]any) {}

// PrepareForUpdate does nothing.
func (Generic) PrepareForUpdate(*registry.Resource, map[string]any, map[string]any) bool {
	return false
}

// Validate accepts everything.
func (Generic) Validate(*registry.Resource, map[string]any, map[string]any) error { return nil }

// Optional capabilities, checked with type assertions.

// StatusUpdater replaces the default status-subresource write (the stored
// object with the new status, metadata and spec unchanged).
type StatusUpdater interface {
	// PrepareForStatusUpdate returns the object to store for a status
	// write of obj over cur; the generic part then keeps cur's
	// server-managed metadata.
	PrepareForStatusUpdate(cur, obj map[string]any) map[string]any
}

// FileNormalizer prepares a hand-edited file (old nil for a new one)
// before the generic part fills its server-managed fields.
type FileNormalizer interface {
	NormalizeFile(res *registry.Resource, old, obj map[string]any)
}

// DecodeErrorer words the error for a body that does not fit the Go type.
type DecodeErrorer interface {
	DecodeError(res *registry.Resource, obj map[string]any, convErr error) error
}

// FieldSelectable lists the field selector keys beyond metadata.name and
// metadata.namespace.
type FieldSelectable interface {
	Fields() []Field
}

// TableConvertor gives the Table columns (Name and Age included).
type TableConvertor interface {
	Columns() []Column
}

// Namer gives the kind's metadata.name rule; nil means none beyond the
// generic path-segment rule (core v1 Events).
type Namer interface {
	NameRule() apimachineryvalidation.ValidateNameFunc
}

// GracefulDeleter is a resource deleted gracefully (pods): the deletion
// timestamp is recorded first, and a grace period may keep the object.
type GracefulDeleter interface {
	// GracePeriod says whether deleting obj must wait and how long.
	GracePeriod(obj map[string]any, opts metav1.DeleteOptions) (int64, bool)
	// WaitsForGracePeriod reports that obj stays, after its last
	// finalizer, until its grace period ends.
	WaitsForGracePeriod(obj map[string]any) bool
}

// FinalizingDeleter is a resource with finalizers in its spec
// (namespaces).
type FinalizingDeleter interface {
	// PrepareForDelete changes an object that starts being deleted.
	PrepareForDelete(obj map[string]any)
	// SpecFinalizers reports finalizers left in the spec.
	SpecFinalizers(obj map[string]any) bool
}

// Controller is background work a resource brings (what
// kube-controller-manager or a kubelet would do), run when controllers
// are on.
type Controller interface {
	// Sync runs one pass; res is the resource the strategy serves.
	Sync(c Cluster, res *registry.Resource)
	// Wakes reports a change the controller reacts to at once (changes
	// that delete objects wake every controller anyway).
	Wakes(ev store.Event) bool
}

// Cluster is what a Controller reads and writes, through the apiserver's
// own create, delete and store paths.
type Cluster interface {
	Lookup(gvr schema.GroupVersionResource) (*registry.Resource, bool)
	// Resources lists every served resource.
	Resources() []*registry.Resource
	List(res *registry.Resource, ns string) []*store.Entry
	Mutate(res *registry.Resource, ns, name string, fn store.MutateFunc) error
	// Create stores a new object (generateName honoured) as a request
	// would.
	Create(res *registry.Resource, ns string, obj map[string]any) error
	Delete(res *registry.Resource, ns, name string, opts metav1.DeleteOptions) error
	Log() logr.Logger
	// LogErr logs errors other than not-found and conflict.
	LogErr(err error, msg string, kv ...any)
}
