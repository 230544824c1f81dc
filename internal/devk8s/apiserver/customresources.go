package apiserver

import (
	"encoding/json"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
)

// Custom resources go through their CRD version's schema
// (registry.Resource.Schema, built by internal/devk8s/crschema from the
// apiextensions-apiserver libraries) at the points where kube-apiserver's
// CRD handler applies it: request bodies are pruned and defaulted as they
// are decoded, the customresource strategy prepares and validates creates,
// updates, patches, applies and status writes, objects are converted to the
// storage version before they are stored, and reads prune and default the
// stored object again.

// crDecodeError is kube-apiserver's answer to a body its decoder refuses.
func crDecodeError(res *registry.Resource, err error) error {
	return apierrors.NewBadRequest(fmt.Sprintf("%s in version %q cannot be handled as a %s: %v", res.Kind, res.Version, res.Kind, err))
}

// strictUnknown is the strict decoding error for unknown fields.
func strictUnknown(paths []string) error {
	errs := make([]error, len(paths))
	for i, p := range paths {
		errs[i] = fmt.Errorf(`unknown field "%s"`, p)
	}
	return runtime.NewStrictDecodingError(errs)
}

// crCreate decodes, prepares and validates a new custom resource
// (prepareCreate already ran).
func (s *Server) crCreate(rq request, obj map[string]any) (map[string]any, error) {
	v := rq.res.Schema
	unknown, err := v.Decode(obj, rq.strict)
	if err != nil {
		return nil, crDecodeError(rq.res, err)
	}
	if len(unknown) > 0 && rq.strict {
		return nil, crDecodeError(rq.res, strictUnknown(unknown))
	}
	if errs := v.BeforeCreate(s.ctx, obj); len(errs) > 0 {
		return nil, apierrors.NewInvalid(v.GroupKind(), str(metaOf(obj), "name"), errs)
	}
	// The generic metadata rules run after the strategy's, as in
	// rest.BeforeCreate (the strategy already checked the kind's own name
	// rules).
	if err := validateSegmentMeta(rq.res, obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// crUpdate decodes, prepares and validates the update of cur (as read) to
// next through the main resource or the status subresource.
func (s *Server) crUpdate(rq request, cur, next map[string]any) (map[string]any, error) {
	v := rq.res.Schema
	unknown, err := v.Decode(next, rq.strict)
	if err != nil {
		return nil, crDecodeError(rq.res, err)
	}
	if len(unknown) > 0 && rq.strict {
		return nil, crDecodeError(rq.res, strictUnknown(unknown))
	}
	if errs := v.BeforeUpdate(s.ctx, rq.sub, next, cur); len(errs) > 0 {
		return nil, apierrors.NewInvalid(v.GroupKind(), rq.name, errs)
	}
	return next, nil
}

// crStrictPatch refuses a patched custom resource with unknown fields, as
// kube-apiserver answers a patch sent with fieldValidation=Strict.
func crStrictPatch(res *registry.Resource, patched map[string]any) error {
	if res.Schema == nil {
		return nil
	}
	unknown, err := res.Schema.Decode(deepCopy(patched), true)
	if err != nil || len(unknown) == 0 {
		return nil // decoding errors surface when the object is decoded for the update
	}
	js, err := json.Marshal(patched)
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	return apierrors.NewInvalid(schema.GroupKind{}, "", field.ErrorList{field.Invalid(field.NewPath("patch"), string(js), strictUnknown(unknown).Error())})
}

// crRead returns a stored custom resource as clients of res see it:
// pruned, defaulted and in res's version. Other objects come back as they
// are.
func crRead(res *registry.Resource, stored map[string]any) (map[string]any, error) {
	if res.Schema == nil || stored == nil {
		return stored, nil
	}
	if rv, err := parseRV(rvOf(stored)); err == nil && res.Schema.ServeAsStored(stored, rv) {
		return stored, nil
	}
	obj, err := res.Schema.Read(stored)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("decode stored %s: %w", res.Kind, err))
	}
	return obj, nil
}

// crStore converts a custom resource to its storage version.
func crStore(res *registry.Resource, obj map[string]any) error {
	if res.Schema == nil {
		return nil
	}
	if err := res.Schema.Store(obj); err != nil {
		return apierrors.NewInternalError(fmt.Errorf("convert %s to the storage version: %w", res.Kind, err))
	}
	return nil
}

// crEntryBytes renders a stored custom resource for a read.
func crEntryBytes(res *registry.Resource, e *store.Entry) ([]byte, bool) {
	if res.Schema == nil || res.Schema.ServeAsStored(e.Object, e.RV) {
		return nil, false
	}
	obj, err := res.Schema.Read(e.Object)
	if err != nil {
		return nil, false
	}
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, false
	}
	return data, true
}

// isStrict reports whether a request asks for strict field validation.
func isStrict(q string) bool { return strings.EqualFold(q, "Strict") }

// validateSegmentMeta is the second half of validateNewMeta for custom
// resources: the generic path-segment name rules, then the file name.
func validateSegmentMeta(res *registry.Resource, obj map[string]any) error {
	u := &unstructured.Unstructured{Object: obj}
	if errs := apimachineryvalidation.ValidateObjectMetaAccessor(u, res.Namespaced, pathSegmentName, field.NewPath("metadata")); len(errs) > 0 {
		return apierrors.NewInvalid(res.GVK().GroupKind(), u.GetName(), errs)
	}
	return fileNameError(res.GVK().GroupKind(), u.GetName())
}
