package apiserver

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/validate/content"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
	"github.com/nstance-dev/nstance/internal/devk8s/strategy"
)

// Names follow kube-apiserver's rules, checked where it checks them:
//
//   - a name in the URL must be a path segment (not "." or "..", no "/" or
//     "%"): 400 "Name parameter invalid";
//   - a namespace in the URL that is "." or ".." makes an invalid storage
//     key: 500 "invalid key"; creating in a namespace that is not a path
//     segment fails the namespace lookup: 500 "invalid resource name";
//   - a new object's metadata is validated with apimachinery's
//     ValidateObjectMeta: namespaces are DNS-1123 labels, everything else
//     served here a DNS-1123 subdomain unless the kind's strategy names
//     another rule (StatefulSets: DNS-1123 labels), except core v1 Events,
//     which keep their legacy leniency (path segments only).
//
// Together with the store's own checks no namespace or name can reach the
// file system as anything but one plain file name inside the data
// directory.

// nameRule is the kind's metadata.name rule: DNS-1123 subdomains unless
// its strategy says otherwise; ok is false for a kind with no rule of its
// own (core v1 Events).
func (s *Server) nameRule(res *registry.Resource) (rule apimachineryvalidation.ValidateNameFunc, ok bool) {
	if n, isNamer := s.strategy(res).(strategy.Namer); isNamer {
		rule := n.NameRule()
		return rule, rule != nil
	}
	return apimachineryvalidation.NameIsDNSSubdomain, true
}

// checkURLNames applies the URL rules above to a parsed request.
func checkURLNames(r *http.Request, rq request) error {
	if rq.name != "" {
		if msgs := content.IsPathSegmentName(rq.name); len(msgs) > 0 {
			return apierrors.NewBadRequest(fmt.Sprintf("Name parameter invalid: %q: %s", rq.name, strings.Join(msgs, ";")))
		}
	}
	if rq.namespace == "" {
		return nil
	}
	msgs := content.IsPathSegmentName(rq.namespace)
	if len(msgs) == 0 {
		return nil
	}
	// A "." or ".." namespace makes an invalid storage key for every verb
	// that reads the key: all but POST.
	if r.Method != http.MethodPost && (rq.namespace == "." || rq.namespace == "..") {
		key := storageKeyPrefix(rq.res) + "/" + rq.namespace
		if rq.name != "" {
			key += "/" + rq.name
		}
		return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError,
			Message: fmt.Sprintf("invalid key: %q", key)}}
	}
	// Creates (POST, and PUT of kinds that create on update) look the
	// namespace up by name, which fails for one that is not a segment.
	if r.Method == http.MethodPost || (r.Method == http.MethodPut && rq.res.CreateOnUpdate && rq.sub == "") {
		return apierrors.NewInternalError(fmt.Errorf("invalid resource name %q: %v", rq.namespace, msgs))
	}
	return nil
}

// storageKeyPrefix is kube-apiserver's etcd key prefix of a resource (as
// its error messages show it): the plural for built-in kinds, group/plural
// for custom resources.
func storageKeyPrefix(res *registry.Resource) string {
	if res.BuiltIn {
		return "/" + res.Resource
	}
	return "/" + res.Group + "/" + res.Resource
}

// validateNewMeta validates the metadata of an object about to be created
// (after prepareCreate, so with the defaults the server adds) in kube's two
// steps: the kind's own rules, then the generic ones with path-segment names.
func (s *Server) validateNewMeta(res *registry.Resource, obj map[string]any) error {
	md := metaOf(obj)
	name := str(md, "name")
	gk := res.GVK().GroupKind()
	var om metav1.ObjectMeta
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(md, &om); err != nil {
		return apierrors.NewBadRequest(fmt.Sprintf("decode metadata: %v", err))
	}
	path := field.NewPath("metadata")
	if rule, ok := s.nameRule(res); ok {
		if errs := apimachineryvalidation.ValidateObjectMetaAccessor(&om, res.Namespaced, rule, path); len(errs) > 0 {
			return apierrors.NewInvalid(gk, name, errs)
		}
	}
	if errs := apimachineryvalidation.ValidateObjectMetaAccessor(&om, res.Namespaced, pathSegmentName, path); len(errs) > 0 {
		return apierrors.NewInvalid(gk, name, errs)
	}
	return fileNameError(gk, name)
}

// pathSegmentName is the generic name rule every kind must pass.
func pathSegmentName(name string, prefix bool) []string {
	if prefix {
		return content.IsPathSegmentPrefix(name)
	}
	return content.IsPathSegmentName(name)
}

// fileNameError refuses names kube-apiserver would take but that cannot be
// one file name (longer than the file system allows).
func fileNameError(gk schema.GroupKind, name string) error {
	if err := store.CheckSegment(name); err != nil && errors.Is(err, store.ErrInvalidName) {
		return apierrors.NewInvalid(gk, name, field.ErrorList{field.Invalid(field.NewPath("metadata", "name"), name,
			"dev-k8s stores each object as the file <name>.json: "+strings.TrimPrefix(err.Error(), store.ErrInvalidName.Error()+": "))})
	}
	return nil
}

// validFileName is the store's check of hand-made files: the namespace
// directory must be a namespace name and the file a name of the kind.
func (s *Server) validFileName(storage, ns, name string) error {
	res, ok := s.reg.ByStorageName(storage)
	if !ok {
		return nil
	}
	if ns != "" {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			return fmt.Errorf("namespace %q: %s", ns, strings.Join(msgs, "; "))
		}
	}
	rule, ok := s.nameRule(res)
	if name == "" || !ok {
		return nil
	}
	if msgs := rule(name, false); len(msgs) > 0 {
		return fmt.Errorf("%s name %q: %s", res.Kind, name, strings.Join(msgs, "; "))
	}
	return nil
}
