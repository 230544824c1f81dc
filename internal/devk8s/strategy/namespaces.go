package strategy

import (
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
)

// Namespaces are core v1 Namespaces: created Active with the kubernetes
// finalizer in their spec, Terminating once deleted, and finished by the
// namespace controller when their content is gone.
type Namespaces struct{ Generic }

// Resource is the registry entry.
func (Namespaces) Resource() registry.Resource {
	return registry.Resource{Version: "v1", Resource: "namespaces", Kind: "Namespace", ShortNames: []string{"ns"}, Status: true, BuiltIn: true, ReturnDeleted: true, Storage: true}
}

// PrepareForCreate sets the name label, the spec finalizer and the phase.
func (Namespaces) PrepareForCreate(_ *registry.Resource, obj map[string]any) {
	md := object.Meta(obj)
	lbls, _ := md["labels"].(map[string]any)
	if lbls == nil {
		lbls = map[string]any{}
		md["labels"] = lbls
	}
	lbls["kubernetes.io/metadata.name"] = object.Str(md, "name")
	obj["spec"] = map[string]any{"finalizers": []any{"kubernetes"}}
	obj["status"] = map[string]any{"phase": "Active"}
}

// Fields are the Namespace field selectors.
func (Namespaces) Fields() []Field { return pathFields("status.phase") }

// Columns are kubectl's Namespace columns.
func (Namespaces) Columns() []Column {
	return withNameAge(pathCol("Status", "string", 0, "status", "phase"))
}

// NameRule: namespace names are DNS-1123 labels.
func (Namespaces) NameRule() apimachineryvalidation.ValidateNameFunc {
	return apimachineryvalidation.ValidateNamespaceName
}

// PrepareForDelete marks the namespace Terminating.
func (Namespaces) PrepareForDelete(obj map[string]any) {
	object.ChildMap(obj, "status")["phase"] = "Terminating"
}

// SpecFinalizers reports spec.finalizers left.
func (Namespaces) SpecFinalizers(obj map[string]any) bool {
	fs, _ := object.Nested(obj, "spec", "finalizers")
	list, _ := fs.([]any)
	return len(list) > 0
}

// Sync finishes deleted namespaces: their content is deleted, and once it
// is gone the spec finalizer goes and the namespace with it.
func (Namespaces) Sync(c Cluster, nsRes *registry.Resource) {
	for _, e := range c.List(nsRes, "") {
		if !object.HasDeletionTimestamp(e.Object) {
			continue
		}
		ns := object.Str(object.Meta(e.Object), "name")
		remaining := 0
		for _, res := range c.Resources() {
			if !res.Namespaced || !res.Storage {
				continue
			}
			for _, it := range c.List(res, ns) {
				remaining++
				if !object.HasDeletionTimestamp(it.Object) {
					c.LogErr(c.Delete(res, ns, object.Str(object.Meta(it.Object), "name"), metav1.DeleteOptions{}), "delete namespace content")
				}
			}
		}
		if remaining > 0 {
			continue
		}
		err := c.Mutate(nsRes, "", ns, func(cur map[string]any) (store.Mutation, error) {
			if cur == nil {
				return store.Mutation{}, apierrors.NewNotFound(nsRes.GroupResource(), ns)
			}
			if spec, _ := cur["spec"].(map[string]any); spec != nil {
				delete(spec, "finalizers")
			}
			if len(finalizers(object.Meta(cur))) == 0 {
				return store.Mutation{Delete: true}, nil
			}
			return store.Mutation{Object: cur}, nil
		})
		c.LogErr(err, "finish namespace deletion")
	}
}

// Wakes: the namespace controller follows deletions only.
func (Namespaces) Wakes(store.Event) bool { return false }

func finalizers(md map[string]any) []string { return object.Finalizers(md) }
