package registry

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nstance-dev/nstance/internal/devk8s/crschema"
)

// Resource describes one served resource in one group version.
type Resource struct {
	Group      string
	Version    string
	Resource   string // plural, lower case
	Singular   string
	Kind       string
	ListKind   string
	Namespaced bool
	ShortNames []string
	Categories []string
	// Status is true when the resource has a status subresource.
	Status bool
	// Subresources other than status (eviction, token, ...).
	Subresources []string
	// Generation is true when metadata.generation is maintained.
	Generation bool
	// BuiltIn is true for kinds compiled into client-go's scheme (strategic
	// merge patch works for them).
	BuiltIn bool
	// PrinterColumns are the CRD's additionalPrinterColumns (nil for built-ins).
	PrinterColumns []apiextensionsv1.CustomResourceColumnDefinition
	// ReturnDeleted makes DELETE answer with the deleted object rather than a Status.
	ReturnDeleted bool
	// CreateOnUpdate lets PUT create a missing object.
	CreateOnUpdate bool
	// Storage is true for the version whose objects are stored (CRDs serve
	// every version from the same files).
	Storage bool
	// Schema applies the CRD version's schema (validation, CEL rules,
	// defaulting, pruning) to custom resources; nil for built-ins.
	Schema *crschema.Version

	dir string
}

// GVR returns the group, version and resource.
func (r *Resource) GVR() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: r.Resource}
}

// GVK returns the group, version and kind.
func (r *Resource) GVK() schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: r.Group, Version: r.Version, Kind: r.Kind}
}

// GroupResource returns the group and resource, as used in error messages.
func (r *Resource) GroupResource() schema.GroupResource {
	return schema.GroupResource{Group: r.Group, Resource: r.Resource}
}

// APIVersion is the apiVersion field value for objects of this resource.
func (r *Resource) APIVersion() string {
	return schema.GroupVersion{Group: r.Group, Version: r.Version}.String()
}

// StorageName is the directory under the data directory holding the
// resource's files, chosen by Registry.StorageDir when it was registered.
func (r *Resource) StorageName() string {
	if r.dir == "" {
		return r.Resource
	}
	return r.dir
}

// Verbs lists the verbs the resource supports.
func (r *Resource) Verbs() []string {
	return []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
}

// Registry is the set of served resources; safe for concurrent use.
type Registry struct {
	mu        sync.RWMutex
	resources map[schema.GroupVersionResource]*Resource
	// preferred version per group, in insertion order of groups.
	groups []string
	// crdOwned maps a CRD name to the resources it registered.
	crdOwned map[string][]schema.GroupVersionResource
	// core holds the plurals of the built-in core group resources.
	core map[string]bool
	// static holds the built-in OpenAPI definitions CRD schemas refer to
	// (built on first use).
	static *crschema.Static
	// noSchemas serves custom resources without their schemas.
	noSchemas bool
}

// IgnoreSchemas makes CRDs registered from now on serve their custom
// resources as they come, without schema validation, defaulting or pruning
// (benchmarks compare against it).
func (r *Registry) IgnoreSchemas() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.noSchemas = true
}

// New returns a registry holding the given built-in resources (the
// strategy package declares them), in discovery order.
func New(builtins ...Resource) *Registry {
	r := &Registry{resources: map[schema.GroupVersionResource]*Resource{}, crdOwned: map[string][]schema.GroupVersionResource{}, core: map[string]bool{}}
	for _, res := range builtins {
		if res.Group == "" {
			r.core[res.Resource] = true
		}
	}
	for _, res := range builtins {
		res := res
		r.add(&res)
	}
	return r
}

// StorageDir returns the directory name for a group and plural resource:
// the plural itself, as developers expect (nodes/, nstancemachinepools/,
// leases/), except for a non-core group whose plural is also a core
// resource (events.k8s.io events), stored as plural.group so the two never
// share files.
func (r *Registry) StorageDir(group, resource string) string {
	if group == "" || !r.core[resource] {
		return resource
	}
	return resource + "." + group
}

func (r *Registry) add(res *Resource) {
	res.dir = r.StorageDir(res.Group, res.Resource)
	if res.ListKind == "" {
		res.ListKind = res.Kind + "List"
	}
	if res.Singular == "" {
		res.Singular = strings.ToLower(res.Kind)
	}
	r.resources[res.GVR()] = res
	found := false
	for _, g := range r.groups {
		if g == res.Group {
			found = true
		}
	}
	if !found {
		r.groups = append(r.groups, res.Group)
	}
}

// Lookup finds a resource by group, version and plural name.
func (r *Registry) Lookup(gvr schema.GroupVersionResource) (*Resource, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	res, ok := r.resources[gvr]
	return res, ok
}

// ByStorageName returns the storage version resource for a directory name.
func (r *Registry) ByStorageName(name string) (*Resource, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var found *Resource
	for _, res := range r.resources {
		if res.StorageName() == name && (found == nil || res.Storage) {
			found = res
		}
	}
	return found, found != nil
}

// ForKind finds the resource serving a group version kind.
func (r *Registry) ForKind(gvk schema.GroupVersionKind) (*Resource, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, res := range r.resources {
		if res.GVK() == gvk {
			return res, true
		}
	}
	return nil, false
}

// All returns every resource, sorted by group, version and name.
func (r *Registry) All() []*Resource {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*Resource, 0, len(r.resources))
	for _, res := range r.resources {
		out = append(out, res)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		if a.Version != b.Version {
			return a.Version < b.Version
		}
		return a.Resource < b.Resource
	})
	return out
}

// Groups returns group names in registration order (core first) with their
// versions, preferred version first.
func (r *Registry) Groups() []GroupVersions {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []GroupVersions
	for _, g := range r.groups {
		seen := map[string]bool{}
		gv := GroupVersions{Group: g}
		for _, res := range r.resources {
			if res.Group != g || seen[res.Version] {
				continue
			}
			seen[res.Version] = true
			gv.Versions = append(gv.Versions, res.Version)
		}
		if len(gv.Versions) == 0 {
			continue
		}
		sortVersions(gv.Versions)
		out = append(out, gv)
	}
	return out
}

// GroupVersions names a group and its served versions, preferred first.
type GroupVersions struct {
	Group    string
	Versions []string
}

// sortVersions orders versions as Kubernetes does: GA before beta before
// alpha, higher numbers first.
func sortVersions(vs []string) {
	sort.SliceStable(vs, func(i, j int) bool {
		return compareVersion(vs[i], vs[j]) > 0
	})
}

func compareVersion(a, b string) int {
	ka, kb := versionKey(a), versionKey(b)
	for i := range ka {
		if ka[i] != kb[i] {
			if ka[i] > kb[i] {
				return 1
			}
			return -1
		}
	}
	return strings.Compare(b, a)
}

// versionKey ranks v1 > v1beta2 > v1beta1 > v1alpha1.
func versionKey(v string) [4]int {
	var major, minor int
	stage := 3
	rest := strings.TrimPrefix(v, "v")
	n, _ := fmt.Sscanf(rest, "%d", &major)
	if n == 0 {
		return [4]int{0, 0, 0, 0}
	}
	digits := len(fmt.Sprint(major))
	tail := rest[digits:]
	switch {
	case strings.HasPrefix(tail, "beta"):
		stage = 2
		minor, _ = strconv.Atoi(strings.TrimPrefix(tail, "beta")) // 0 when absent
	case strings.HasPrefix(tail, "alpha"):
		stage = 1
		minor, _ = strconv.Atoi(strings.TrimPrefix(tail, "alpha")) // 0 when absent
	case tail != "":
		stage = 0
	}
	return [4]int{1, stage, major, minor}
}

// BuiltInGroup reports whether a group has built-in (non-CRD) resources.
func (r *Registry) BuiltInGroup(group string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, res := range r.resources {
		if res.Group == group && res.BuiltIn {
			return true
		}
	}
	return false
}

// AddCRD registers (or re-registers) the served versions of a CRD.
func (r *Registry) AddCRD(crd *apiextensionsv1.CustomResourceDefinition) error {
	if crd.Spec.Names.Plural == "" || crd.Spec.Names.Kind == "" || crd.Spec.Group == "" {
		return fmt.Errorf("crd %q: group, names.plural and names.kind are required", crd.Name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.static == nil {
		static, err := crschema.NewStatic()
		if err != nil {
			return err
		}
		r.static = static
	}
	kind, err := crschema.New(crd, r.static)
	if err != nil {
		return fmt.Errorf("crd %q: %w", crd.Name, err)
	}
	dir := r.StorageDir(crd.Spec.Group, crd.Spec.Names.Plural)
	for _, other := range r.resources {
		if other.Group != crd.Spec.Group && other.StorageName() == dir {
			return fmt.Errorf("crd %q: plural %q is already served by group %q and stored in %s/; "+
				"dev-k8s keeps one directory per plural", crd.Name, crd.Spec.Names.Plural, other.Group, dir)
		}
	}
	r.removeCRDLocked(crd.Name)
	var owned []schema.GroupVersionResource
	for _, v := range crd.Spec.Versions {
		if !v.Served {
			continue
		}
		res := &Resource{
			Group:          crd.Spec.Group,
			Version:        v.Name,
			Resource:       crd.Spec.Names.Plural,
			Singular:       crd.Spec.Names.Singular,
			Kind:           crd.Spec.Names.Kind,
			ListKind:       crd.Spec.Names.ListKind,
			Namespaced:     crd.Spec.Scope == apiextensionsv1.NamespaceScoped,
			ShortNames:     crd.Spec.Names.ShortNames,
			Categories:     crd.Spec.Names.Categories,
			Status:         v.Subresources != nil && v.Subresources.Status != nil,
			Generation:     true,
			PrinterColumns: v.AdditionalPrinterColumns,
			Storage:        v.Storage,
			Schema:         kind.Version(v.Name),
		}
		if r.noSchemas {
			res.Schema = nil
		}
		r.add(res)
		owned = append(owned, res.GVR())
	}
	r.crdOwned[crd.Name] = owned
	return nil
}

// RemoveCRD stops serving the resources a CRD registered.
func (r *Registry) RemoveCRD(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removeCRDLocked(name)
}

func (r *Registry) removeCRDLocked(name string) {
	for _, gvr := range r.crdOwned[name] {
		delete(r.resources, gvr)
	}
	delete(r.crdOwned, name)
}
