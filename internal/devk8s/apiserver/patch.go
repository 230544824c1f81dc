package apiserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/mergepatch"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
)

func yamlToJSON(data []byte) ([]byte, error) {
	out, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("error decoding YAML: %w", err)
	}
	return out, nil
}

func unprocessable(msg string) error {
	return apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "", msg, 0, false)
}

func patchTypes(res *registry.Resource) []string {
	pts := []string{string(types.JSONPatchType), string(types.MergePatchType)}
	if res.BuiltIn {
		pts = append(pts, string(types.StrategicMergePatchType))
	}
	return append(pts, string(types.ApplyYAMLPatchType))
}

// unsupportedMediaType mirrors kube-apiserver's answer for a patch type the
// resource does not take.
func unsupportedMediaType(accepted []string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusUnsupportedMediaType,
		Reason:  metav1.StatusReasonUnsupportedMediaType,
		Message: "the body of the request was in an unknown format - accepted media types include: " + strings.Join(accepted, ", "),
	}}
}

// applyConfig runs server-side apply of a YAML or JSON configuration.
func (s *Server) applyConfig(rq request, cur map[string]any, body []byte, force bool) (map[string]any, error) {
	js, err := yamlToJSON(body)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	applied, err := decodeBody(js)
	if err != nil {
		return nil, err
	}
	if err := checkTypeMeta(applied, rq.res); err != nil {
		return nil, err
	}
	if str(applied, "apiVersion") == "" || str(applied, "kind") == "" {
		return nil, apierrors.NewBadRequest("apiVersion and kind must be set in an applied configuration")
	}
	_, hadNS := metaOf(applied)["namespace"]
	if err := admitObject(rq, applied); err != nil {
		return nil, err
	}
	if !hadNS {
		delete(metaOf(applied), "namespace")
	}
	return s.serverSideApply(rq.res, rq.sub, rq.namespace, cur, applied, rq.manager, force)
}

// applyPatch computes the patched form of cur (nil cur only for apply).
func (s *Server) applyPatch(res *registry.Resource, pt types.PatchType, cur map[string]any, patch []byte) (map[string]any, error) {
	curJSON, err := json.Marshal(cur)
	if err != nil {
		return nil, fmt.Errorf("encode object: %w", err)
	}
	var out []byte
	switch pt {
	case types.JSONPatchType:
		p, err := jsonpatch.DecodePatch(patch)
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		if out, err = applyJSONPatch(p, curJSON); err != nil {
			return nil, unprocessable(err.Error())
		}
	case types.MergePatchType:
		out, err = jsonpatch.MergePatch(curJSON, patch)
		if errors.Is(err, jsonpatch.ErrBadJSONPatch) {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		if err != nil {
			return nil, unprocessable(err.Error())
		}
	case types.StrategicMergePatchType:
		typed, err := s.scheme.New(res.GVK())
		if err != nil {
			return nil, unsupportedMediaType(patchTypes(res))
		}
		out, err = strategicpatch.StrategicMergePatch(curJSON, patch, typed)
		if err != nil {
			switch {
			case errors.Is(err, mergepatch.ErrBadJSONDoc), errors.Is(err, mergepatch.ErrBadPatchFormatForPrimitiveList),
				errors.Is(err, mergepatch.ErrBadPatchFormatForRetainKeys), errors.Is(err, mergepatch.ErrBadPatchFormatForSetElementOrderList),
				errors.Is(err, mergepatch.ErrUnsupportedStrategicMergePatchFormat):
				return nil, apierrors.NewBadRequest(err.Error())
			}
			return nil, unprocessable(err.Error())
		}
	default:
		return nil, unsupportedMediaType(patchTypes(res))
	}
	obj, err := decodeBody(out)
	if err != nil {
		return nil, err
	}
	return obj, nil
}

func (s *Server) patch(w http.ResponseWriter, r *http.Request, rq request) {
	ct := r.Header.Get("Content-Type")
	if i := strings.Index(ct, ";"); i > 0 {
		ct = ct[:i]
	}
	pt := types.PatchType(strings.TrimSpace(ct))
	supported := false
	for _, p := range patchTypes(rq.res) {
		if string(pt) == p {
			supported = true
		}
	}
	if !supported {
		writeError(w, unsupportedMediaType(patchTypes(rq.res)))
		return
	}
	body, err := readBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if pt == types.ApplyYAMLPatchType && r.URL.Query().Get("fieldManager") == "" {
		writeError(w, apierrors.NewInvalid(schemaGK("meta.k8s.io", "PatchOptions"), "", field.ErrorList{field.Required(field.NewPath("fieldManager"), "is required for apply patch")}))
		return
	}
	created := false
	// Checked before taking the store lock; used only if apply creates.
	nsErr := s.checkNamespace(rq.res, rq.namespace, true)
	apply := pt == types.ApplyYAMLPatchType
	force := isTrue(r.URL.Query().Get("force"))
	urq := rq
	urq.applied = apply
	urq.strict = false // patches check unknown fields on the patched object (crStrictPatch)
	result, err := s.store.Mutate(rq.res.StorageName(), rq.namespace, rq.name, dryRunFunc(isDryRun(r), func(cur map[string]any) (store.Mutation, error) {
		if cur == nil && !apply {
			return store.Mutation{}, apierrors.NewNotFound(rq.res.GroupResource(), rq.name)
		}
		cur, err := crRead(rq.res, cur)
		if err != nil {
			return store.Mutation{}, err
		}
		var obj map[string]any
		if apply {
			obj, err = s.applyConfig(urq, cur, body, force)
		} else {
			obj, err = s.applyPatch(rq.res, pt, cur, body)
			if err == nil && rq.strict {
				err = crStrictPatch(rq.res, obj)
			}
		}
		if err != nil {
			return store.Mutation{}, err
		}
		if err := checkTypeMeta(obj, rq.res); err != nil {
			return store.Mutation{}, err
		}
		md := metaOf(obj)
		if n := str(md, "name"); n != rq.name {
			return store.Mutation{}, apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", n, rq.name))
		}
		if err := admitObject(rq, obj); err != nil {
			return store.Mutation{}, err
		}
		if cur == nil {
			if nsErr != nil {
				return store.Mutation{}, nsErr
			}
			s.prepareCreate(rq.res, obj, timeNow())
			created = true
			if rq.res.Schema != nil {
				if obj, err = s.crCreate(urq, obj); err != nil {
					return store.Mutation{}, err
				}
				return store.Mutation{Object: obj}, crStore(rq.res, obj)
			}
			obj, err = s.roundTrip(rq.res, obj)
			if err != nil {
				return store.Mutation{}, err
			}
			return store.Mutation{Object: obj}, s.validate(rq.res, nil, obj)
		}
		if rv := str(md, "resourceVersion"); rv != "" && rv != rvOf(cur) {
			return store.Mutation{}, conflict(rq.res, rq.name)
		}
		return s.finishUpdate(urq, cur, s.prepareUpdate(rq.res, rq.sub, cur, obj))
	}))
	if err != nil {
		writeError(w, err)
		return
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
	}
	s.writeEntry(w, r, code, rq.res, result.Entry)
}

// applyJSONPatch applies p to doc. json-patch v4 dereferences nil on some
// operations without a value (a replace of the whole document): that
// panic is an error about the patch, not about the server.
func applyJSONPatch(p jsonpatch.Patch, doc []byte) (out []byte, err error) {
	defer func() {
		if rec := recover(); rec != nil {
			out, err = nil, fmt.Errorf("the JSON patch cannot be applied (an operation lacks a value it needs): %v", rec)
		}
	}()
	return p.Apply(doc)
}
