package apiserver

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/client-go/applyconfigurations"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// Server-side apply and managedFields come from apimachinery's field
// manager, the one kube-apiserver uses. Built-in kinds use client-go's
// structured schema (list merge keys included); custom resources are typed
// from their CRD's schemas, as kube-apiserver does (crschema).

// unstructuredConvertor changes only the apiVersion: every served version of
// a kind has the same shape in dev-k8s.
type unstructuredConvertor struct{}

func (unstructuredConvertor) Convert(in, out, _ any) error {
	return fmt.Errorf("convert %T to %T: not supported", in, out)
}

func (unstructuredConvertor) ConvertToVersion(in runtime.Object, target runtime.GroupVersioner) (runtime.Object, error) {
	u, ok := in.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("convert %T: only unstructured objects", in)
	}
	gvk, ok := target.KindForGroupVersionKinds([]schema.GroupVersionKind{u.GroupVersionKind()})
	if !ok {
		return nil, fmt.Errorf("no version of %s for %v", u.GroupVersionKind(), target)
	}
	out := u.DeepCopy()
	out.SetGroupVersionKind(gvk)
	return out, nil
}

func (unstructuredConvertor) ConvertFieldLabel(_ schema.GroupVersionKind, label, value string) (string, string, error) {
	return label, value, nil
}

type noDefaults struct{}

func (noDefaults) Default(runtime.Object) {}

type unstructuredCreater struct{}

func (unstructuredCreater) New(gvk schema.GroupVersionKind) (runtime.Object, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u, nil
}

// fieldManager returns the (cached) field manager of a resource and
// subresource.
func (s *Server) fieldManager(res *registry.Resource, sub string) (*managedfields.FieldManager, error) {
	key := res.GVK().String() + "/" + sub
	if res.Schema != nil {
		// A changed CRD brings new schemas (and a new Schema).
		key = fmt.Sprintf("%s/%p", key, res.Schema)
	}
	s.fmMu.Lock()
	defer s.fmMu.Unlock()
	if fm, ok := s.fieldManagers[key]; ok {
		return fm, nil
	}
	tc := managedfields.NewDeducedTypeConverter()
	if res.Schema != nil {
		tc = res.Schema.TypeConverter()
	}
	if res.BuiltIn && res.Group != "apiextensions.k8s.io" {
		if s.builtinTypes == nil {
			s.builtinTypes = applyconfigurations.NewTypeConverter(s.scheme)
		}
		tc = s.builtinTypes
	}
	fm, err := managedfields.NewDefaultCRDFieldManager(tc, unstructuredConvertor{}, noDefaults{},
		unstructuredCreater{}, res.GVK(), res.GVK().GroupVersion(), sub, nil)
	if err != nil {
		return nil, err
	}
	s.fieldManagers[key] = fm
	return fm, nil
}

// managerName is the field manager of a request: the fieldManager
// parameter, else the User-Agent up to its first slash (as kube-apiserver).
func managerName(r *http.Request) string {
	if m := r.URL.Query().Get("fieldManager"); m != "" {
		return m
	}
	ua := r.Header.Get("User-Agent")
	if i := strings.Index(ua, "/"); i >= 0 {
		ua = ua[:i]
	}
	return ua
}

// trackUpdate records a non-apply write in managedFields. live is nil for
// a create. Failures leave the object without managedFields, as
// kube-apiserver does.
func (s *Server) trackUpdate(res *registry.Resource, sub string, live, obj map[string]any, manager string) map[string]any {
	if manager == "" {
		return obj
	}
	fm, err := s.fieldManager(res, sub)
	if err != nil {
		s.log.Error(err, "field manager")
		return obj
	}
	liveObj := &unstructured.Unstructured{Object: live}
	if live == nil {
		liveObj = &unstructured.Unstructured{Object: map[string]any{}}
		liveObj.SetGroupVersionKind(res.GVK())
	}
	out := fm.UpdateNoErrors(liveObj, &unstructured.Unstructured{Object: obj}, manager)
	if u, ok := out.(*unstructured.Unstructured); ok {
		return u.Object
	}
	return obj
}

// serverSideApply merges an applied configuration into live (nil when
// absent) with field ownership; conflicts come back as 409 errors.
// namespace is the request's: applied carries one only if the client sent
// it, as in kube-apiserver (it shows in error messages).
func (s *Server) serverSideApply(res *registry.Resource, sub, namespace string, live, applied map[string]any, manager string, force bool) (map[string]any, error) {
	fm, err := s.fieldManager(res, sub)
	if err != nil {
		return nil, err
	}
	liveObj := &unstructured.Unstructured{Object: live}
	if live == nil {
		liveObj = &unstructured.Unstructured{Object: map[string]any{}}
		liveObj.SetGroupVersionKind(res.GVK())
		liveObj.SetName(nestedString(applied, "metadata", "name"))
		liveObj.SetNamespace(namespace)
	}
	out, err := fm.Apply(liveObj, &unstructured.Unstructured{Object: applied}, manager, force)
	if err != nil {
		var st apierrors.APIStatus
		if errors.As(err, &st) {
			return nil, err
		}
		// Answered as kube-apiserver answers an error without a status.
		return nil, &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Message: err.Error()}}
	}
	u, ok := out.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("apply returned %T", out)
	}
	return u.Object, nil
}
