package crschema

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"

	"k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apiextensions-apiserver/pkg/crdserverscheme"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource"
	metavalidation "k8s.io/apimachinery/pkg/api/validation"
	apipath "k8s.io/apimachinery/pkg/api/validation/path"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// strategy is the part of kube-apiserver's custom resource REST strategies
// (customresource.NewStrategy and NewStatusStrategy) dev-k8s drives.
type strategy interface {
	PrepareForCreate(ctx context.Context, obj runtime.Object)
	PrepareForUpdate(ctx context.Context, obj, old runtime.Object)
	Validate(ctx context.Context, obj runtime.Object) field.ErrorList
	ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList
}

// Kind holds the schemas of every version of one CRD.
type Kind struct {
	gk              schema.GroupKind
	storage         string
	preserveUnknown bool
	structural      map[string]*structuralschema.Structural
	// defaults and embedded hold the versions whose structural schema
	// has defaults or embedded resources (x-kubernetes-embedded-resource):
	// without them, defaulting and embedded ObjectMeta coercion change
	// nothing and are skipped.
	defaults map[string]bool
	embedded map[string]bool
	// prune tells whether pruning would delete anything (per version).
	prune    map[string]*pruneNode
	versions map[string]*Version
	types    managedfields.TypeConverter
	// since is the resourceVersion from which stored objects were written
	// through this Kind (pruned and defaulted by it); MaxUint64 until set.
	since atomic.Uint64
}

// Version is one served version of a CRD.
type Version struct {
	kind       *Kind
	namespaced bool
	name       string
	main       strategy
	status     strategy // nil without a status subresource
	// create is main's Validate without the no-op embedded-resource walk
	// (nil: main's Validate).
	create *createValidation
}

// New builds the schemas of a CRD as kube-apiserver's CRD handler does when
// it starts serving it. static may be nil: server-side apply then deduces
// types from the objects.
func New(crd *apiextensionsv1.CustomResourceDefinition, static *Static) (*Kind, error) {
	storage, err := apihelpers.GetCRDStorageVersion(crd)
	if err != nil {
		return nil, err
	}
	k := &Kind{
		gk:              schema.GroupKind{Group: crd.Spec.Group, Kind: crd.Spec.Names.Kind},
		storage:         storage,
		preserveUnknown: crd.Spec.PreserveUnknownFields,
		structural:      map[string]*structuralschema.Structural{},
		defaults:        map[string]bool{},
		embedded:        map[string]bool{},
		prune:           map[string]*pruneNode{},
		versions:        map[string]*Version{},
	}
	internal := map[string]*apiextensionsinternal.CustomResourceValidation{}
	for _, v := range crd.Spec.Versions {
		val, err := apihelpers.GetSchemaForVersion(crd, v.Name)
		if err != nil {
			return nil, err
		}
		if val == nil {
			continue
		}
		iv := &apiextensionsinternal.CustomResourceValidation{}
		if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(val, iv, nil); err != nil {
			return nil, fmt.Errorf("convert schema of %s version %s: %w", crd.Name, v.Name, err)
		}
		internal[v.Name] = iv
		s, err := structuralschema.NewStructural(iv.OpenAPIV3Schema)
		if err != nil {
			if crd.Spec.PreserveUnknownFields {
				continue
			}
			return nil, fmt.Errorf("schema of %s version %s is not structural: %w", crd.Name, v.Name, err)
		}
		if !crd.Spec.PreserveUnknownFields {
			s = s.DeepCopy()
			if err := structuraldefaulting.PruneDefaults(s); err != nil {
				return nil, fmt.Errorf("prune defaults of %s version %s: %w", crd.Name, v.Name, err)
			}
		}
		k.structural[v.Name] = s
		k.prune[v.Name] = newPruneRoot(s)
		k.defaults[v.Name] = anyNode(s, func(n *structuralschema.Structural) bool { return n.Default.Object != nil })
		k.embedded[v.Name] = anyNode(s, func(n *structuralschema.Structural) bool { return n.XEmbeddedResource })
	}
	k.since.Store(math.MaxUint64)
	if k.types, err = typeConverter(static, crd); err != nil {
		return nil, err
	}
	typer := crdserverscheme.NewUnstructuredObjectTyper()
	for _, v := range crd.Spec.Versions {
		if !v.Served {
			continue
		}
		var props *apiextensionsinternal.JSONSchemaProps
		if iv := internal[v.Name]; iv != nil {
			props = iv.OpenAPIV3Schema
		}
		validator, openAPI, err := apiservervalidation.NewSchemaValidator(props)
		if err != nil {
			return nil, fmt.Errorf("schema validator of %s version %s: %w", crd.Name, v.Name, err)
		}
		validator = newSchemaValidator(validator, openAPI)
		subs, err := apihelpers.GetSubresourcesForVersion(crd, v.Name)
		if err != nil {
			return nil, err
		}
		var statusSpec *apiextensionsinternal.CustomResourceSubresourceStatus
		var statusValidator apiservervalidation.SchemaValidator
		if subs != nil && subs.Status != nil {
			statusSpec = &apiextensionsinternal.CustomResourceSubresourceStatus{}
			if props != nil && props.Properties != nil {
				if st, ok := props.Properties["status"]; ok {
					lib, openAPI, err := apiservervalidation.NewSchemaValidator(&st)
					if err != nil {
						return nil, fmt.Errorf("status schema validator of %s version %s: %w", crd.Name, v.Name, err)
					}
					statusValidator = newSchemaValidator(lib, openAPI)
				}
			}
		}
		var scaleSpec *apiextensionsinternal.CustomResourceSubresourceScale
		if subs != nil && subs.Scale != nil {
			scaleSpec = &apiextensionsinternal.CustomResourceSubresourceScale{}
			if err := apiextensionsv1.Convert_v1_CustomResourceSubresourceScale_To_apiextensions_CustomResourceSubresourceScale(subs.Scale, scaleSpec, nil); err != nil {
				return nil, fmt.Errorf("convert scale subresource of %s version %s: %w", crd.Name, v.Name, err)
			}
		}
		gvk := k.gk.WithVersion(v.Name)
		main := customresource.NewStrategy(typer, crd.Spec.Scope == apiextensionsv1.NamespaceScoped, gvk,
			validator, statusValidator, k.structural[v.Name], statusSpec, scaleSpec, v.SelectableFields)
		ver := &Version{kind: k, namespaced: crd.Spec.Scope == apiextensionsv1.NamespaceScoped, name: v.Name, main: main,
			create: newCreateValidation(gvk, crd.Spec.Scope == apiextensionsv1.NamespaceScoped, validator, k.structural[v.Name], scaleSpec, k.embedded[v.Name])}
		if statusSpec != nil {
			ver.status = customresource.NewStatusStrategy(main)
		}
		k.versions[v.Name] = ver
	}
	return k, nil
}

// ForObject returns the served version named by an object's apiVersion,
// or this version when it names none of this kind's versions.
func (v *Version) ForObject(obj map[string]any) *Version {
	apiVersion, _ := obj["apiVersion"].(string)
	if gv, err := schema.ParseGroupVersion(apiVersion); err == nil && gv.Group == v.kind.gk.Group {
		if other := v.kind.versions[gv.Version]; other != nil {
			return other
		}
	}
	return v
}

// Version returns a served version (nil if the CRD does not serve it).
func (k *Kind) Version(name string) *Version { return k.versions[name] }

// TypeConverter types server-side apply and managedFields for this CRD.
func (v *Version) TypeConverter() managedfields.TypeConverter { return v.kind.types }

// GroupKind is the kind's group and kind, as named in errors.
func (v *Version) GroupKind() schema.GroupKind { return v.kind.gk }

// coerce is what kube-apiserver's decoders do to a custom resource after
// JSON decoding (its unstructuredSchemaCoercer): ObjectMeta is decoded and
// re-encoded, unknown fields are pruned and non-nullable nulls dropped, and
// embedded ObjectMeta is coerced. It returns the unknown field paths.
func (k *Kind) coerce(obj map[string]any, version string, fromStorage, track bool) ([]string, error) {
	u := &unstructured.Unstructured{Object: obj}
	kind, foundKind, err := unstructured.NestedString(obj, "kind")
	if err != nil {
		return nil, err
	}
	apiVersion, foundAPIVersion, err := unstructured.NestedString(obj, "apiVersion")
	if err != nil {
		return nil, err
	}
	// Request bodies usually carry plain metadata whose JSON round trip
	// through ObjectMeta is known without doing it (plainMeta).
	var objectMeta *metav1.ObjectMeta
	var unknown []string
	plain, foundMeta := map[string]any(nil), false
	if !fromStorage {
		plain, foundMeta = plainMeta(obj)
	}
	if !foundMeta {
		objectMeta, foundMeta, unknown, err = schemaobjectmeta.GetObjectMetaWithOptions(obj, schemaobjectmeta.ObjectMetaOptions{
			DropMalformedFields:     fromStorage,
			ReturnUnknownFieldPaths: track,
		})
		if err != nil {
			return nil, err
		}
	}
	s := k.structural[version]
	if !k.preserveUnknown {
		// Pruning that would delete nothing is left out (prunes walks
		// the same way without copying every schema node it visits).
		if k.prune[version].prunes(obj) {
			unknown = append(unknown, structuralpruning.PruneWithOptions(obj, s, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: track})...)
		}
		// It only deletes null values: an object without any has none to
		// delete (finding out is much cheaper than the schema walk).
		// Metadata found above is written back below whatever happens
		// to it here.
		if hasNullOutside(obj, foundMeta) {
			structuraldefaulting.PruneNonNullableNullsWithoutDefaults(obj, s)
		}
	}
	// Not at the resource root, it only coerces embedded resources.
	if k.embedded[version] {
		ferr, paths := schemaobjectmeta.CoerceWithOptions(nil, obj, s, false, schemaobjectmeta.CoerceOptions{
			DropInvalidFields:       fromStorage,
			ReturnUnknownFieldPaths: track,
		})
		if ferr != nil {
			return nil, ferr
		}
		unknown = append(unknown, paths...)
	}
	if fromStorage && foundMeta && objectMeta.Generation == 0 {
		objectMeta.Generation = 1
	}
	if foundKind {
		u.SetKind(kind)
	}
	if foundAPIVersion {
		u.SetAPIVersion(apiVersion)
	}
	switch {
	case plain != nil:
		obj["metadata"] = plain
	case foundMeta:
		if err := schemaobjectmeta.SetObjectMeta(obj, objectMeta); err != nil {
			return nil, err
		}
	}
	return unknown, nil
}

// applyDefaults applies a version's defaults (none without a structural
// schema) to obj.
func (k *Kind) applyDefaults(obj map[string]any, version string) {
	if k.defaults[version] {
		structuraldefaulting.Default(obj, k.structural[version])
	}
}

// anyNode reports whether f holds for a node of s reachable through
// properties, additionalProperties or items (the nodes pruning,
// defaulting and coercion visit).
func anyNode(s *structuralschema.Structural, f func(*structuralschema.Structural) bool) bool {
	if s == nil {
		return false
	}
	if f(s) || anyNode(s.Items, f) {
		return true
	}
	if s.AdditionalProperties != nil && anyNode(s.AdditionalProperties.Structural, f) {
		return true
	}
	for name := range s.Properties {
		p := s.Properties[name]
		if anyNode(&p, f) {
			return true
		}
	}
	return false
}

// hasNullOutside reports whether an object holds a null anywhere, its
// metadata left out with skipMeta.
func hasNullOutside(obj map[string]any, skipMeta bool) bool {
	for k, v := range obj {
		if (!skipMeta || k != "metadata") && hasNull(v) {
			return true
		}
	}
	return false
}

// hasNull reports whether a JSON value holds a null anywhere.
func hasNull(x any) bool {
	switch x := x.(type) {
	case nil:
		return true
	case map[string]any:
		for _, v := range x {
			if hasNull(v) {
				return true
			}
		}
	case []any:
		for _, v := range x {
			if hasNull(v) {
				return true
			}
		}
	}
	return false
}

// Decode does to a request body in this version what kube-apiserver's
// request decoder does: coercion and pruning with this version's schema,
// then its defaults. With track, it returns the paths of the unknown fields
// it pruned (what fieldValidation=Strict refuses; finding them costs time).
func (v *Version) Decode(obj map[string]any, track bool) ([]string, error) {
	unknown, err := v.kind.coerce(obj, v.name, false, track)
	if err != nil {
		return nil, err
	}
	v.kind.applyDefaults(obj, v.name)
	return unknown, nil
}

// Read returns a stored object as kube-apiserver serves it in this
// version: decoded from storage (malformed metadata dropped, unknown fields
// pruned, the stored version's defaults applied) and converted with the
// None strategy (apiVersion changes, this version's schema prunes). The
// stored object is not modified.
func (v *Version) Read(stored map[string]any) (map[string]any, error) {
	obj := runtime.DeepCopyJSON(stored)
	from := v.kind.storage
	if gv, err := schema.ParseGroupVersion(fmt.Sprint(obj["apiVersion"])); err == nil && gv.Group == v.kind.gk.Group && v.kind.versions[gv.Version] != nil {
		from = gv.Version
	}
	obj["apiVersion"] = v.kind.gk.WithVersion(from).GroupVersion().String()
	if _, err := v.kind.coerce(obj, from, true, false); err != nil {
		return nil, err
	}
	v.kind.applyDefaults(obj, from)
	obj["apiVersion"] = v.kind.gk.WithVersion(v.name).GroupVersion().String()
	if from != v.name {
		if _, err := v.kind.coerce(obj, v.name, false, false); err != nil {
			return nil, err
		}
	}
	return obj, nil
}

// WrittenSince records that objects stored with a resourceVersion above rv
// were written through this Kind (the CRD's resourceVersion when it was
// registered), so reads in the storage version may serve them as stored.
func (v *Version) WrittenSince(rv uint64) { v.kind.since.Store(rv) }

// ServeAsStored reports whether a stored object with this resourceVersion
// reads in this version exactly as stored: it is in the storage version and
// was pruned and defaulted by this Kind when it was written. Read would
// return an equal object.
func (v *Version) ServeAsStored(stored map[string]any, rv uint64) bool {
	return v.name == v.kind.storage && rv > v.kind.since.Load() &&
		stored["apiVersion"] == v.kind.gk.WithVersion(v.name).GroupVersion().String()
}

// Store converts an object of this version to the storage version (None
// strategy: the apiVersion changes and the storage version's schema prunes).
func (v *Version) Store(obj map[string]any) error {
	obj["apiVersion"] = v.kind.gk.WithVersion(v.kind.storage).GroupVersion().String()
	if v.kind.storage == v.name {
		return nil
	}
	_, err := v.kind.coerce(obj, v.kind.storage, false, false)
	return err
}

// HasStatus reports whether this version has a status subresource.
func (v *Version) HasStatus() bool { return v.status != nil }

// BeforeCreate prepares and validates a new object as kube-apiserver's
// rest.BeforeCreate does with the custom resource strategy: status is
// dropped when there is a status subresource, generation starts at 1, and
// the object is validated (metadata, OpenAPI schema, embedded resources,
// list types, CEL rules).
func (v *Version) BeforeCreate(ctx context.Context, obj map[string]any) field.ErrorList {
	u := &unstructured.Unstructured{Object: obj}
	v.main.PrepareForCreate(ctx, u)
	return v.validateNew(ctx, u)
}

// validateNew is the strategy's Validate of a new object.
func (v *Version) validateNew(ctx context.Context, u *unstructured.Unstructured) field.ErrorList {
	if v.create != nil {
		return v.create.validate(ctx, u)
	}
	return v.main.Validate(ctx, u)
}

// BeforeUpdate prepares and validates an update of old to obj through the
// main resource (sub "") or the status subresource, as rest.BeforeUpdate
// does: generation is reset to old's and bumped by the strategy when
// anything but metadata changed (status excluded when it has its own
// subresource), and the update is validated, CEL transition rules included.
func (v *Version) BeforeUpdate(ctx context.Context, sub string, obj, old map[string]any) field.ErrorList {
	st := v.main
	if sub == "status" && v.status != nil {
		st = v.status
	}
	u, uOld := &unstructured.Unstructured{Object: obj}, &unstructured.Unstructured{Object: old}
	u.SetGeneration(uOld.GetGeneration())
	st.PrepareForUpdate(ctx, u, uOld)
	if len(u.GetUID()) == 0 {
		u.SetUID(uOld.GetUID())
	}
	// rest.BeforeUpdate's common checks come first, then the strategy's.
	path := field.NewPath("metadata")
	errs := metavalidation.ValidateObjectMetaAccessor(u, v.namespaced, apipath.ValidatePathSegmentName, path) //nolint:staticcheck // the name rule kube-apiserver's custom resource strategy applies
	errs = append(errs, metavalidation.ValidateObjectMetaAccessorUpdate(u, uOld, path)...)
	return append(errs, st.ValidateUpdate(ctx, u, uOld)...)
}

// ValidateFile validates an object that arrived as a hand-edited file,
// against the previous object when there is one (so transition rules
// apply), without resetting any field.
func (v *Version) ValidateFile(ctx context.Context, obj, old map[string]any) field.ErrorList {
	u := &unstructured.Unstructured{Object: obj}
	if old == nil {
		return v.validateNew(ctx, u)
	}
	return v.main.ValidateUpdate(ctx, u, &unstructured.Unstructured{Object: old})
}
