package apiserver

import (
	"fmt"
	"reflect"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/strategy"
)

// strategy returns the rules of a resource: its built-in strategy, or the
// generic one for custom resources.
func (s *Server) strategy(res *registry.Resource) strategy.Strategy {
	if res.BuiltIn {
		if st, ok := s.strategies[res.GroupResource()]; ok {
			return st
		}
	}
	return strategy.Generic{}
}

// roundTrip passes a built-in object through its Go type, as
// kube-apiserver's decoding and encoding do: defaults first, then unknown
// fields go, and fields the type always writes appear.
func (s *Server) roundTrip(res *registry.Resource, obj map[string]any) (map[string]any, error) {
	if !res.BuiltIn {
		return obj, nil
	}
	typed, err := s.scheme.New(res.GVK())
	if err != nil {
		return obj, nil
	}
	st := s.strategy(res)
	st.Default(res, obj)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, typed); err != nil {
		if de, ok := st.(strategy.DecodeErrorer); ok {
			return nil, de.DecodeError(res, obj, err)
		}
		return nil, apierrors.NewBadRequest(fmt.Sprintf("decode %s: %v", res.Kind, err))
	}
	out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	out["apiVersion"], out["kind"] = res.APIVersion(), res.Kind
	return out, nil
}

// validate applies the resource's validation rules.
func (s *Server) validate(res *registry.Resource, old, obj map[string]any) error {
	if !res.BuiltIn {
		return nil
	}
	return s.strategy(res).Validate(res, old, obj)
}

// normalizeFile prepares a hand-edited object for the store: the
// resource's own preparation (an apps object gets the defaults and type
// pruning an API write gets, before the generic part compares specs for
// its generation), then the generic server-managed fields.
func (s *Server) normalizeFile(storage string, old, obj map[string]any) {
	res, ok := s.reg.ByStorageName(storage)
	if !ok {
		return
	}
	if fn, ok := s.strategy(res).(strategy.FileNormalizer); ok {
		fn.NormalizeFile(res, old, obj)
	}
	normalizeFileObject(res, old, obj)
}

// normalizeFileObject fills server-managed fields of a hand-edited file.
func normalizeFileObject(res *registry.Resource, old, obj map[string]any) {
	if str(obj, "apiVersion") == "" {
		obj["apiVersion"] = res.APIVersion()
	}
	if str(obj, "kind") == "" {
		obj["kind"] = res.Kind
	}
	md := metaOf(obj)
	if old != nil {
		omd := metaOf(old)
		for _, k := range []string{"uid", "creationTimestamp"} {
			if str(md, k) == "" {
				md[k] = omd[k]
			}
		}
		if res.Generation {
			g := generationOf(omd)
			if specChanged(old, obj) {
				g++
			}
			md["generation"] = g
		}
		return
	}
	if str(md, "uid") == "" {
		md["uid"] = string(uuid.NewUUID())
	}
	if str(md, "creationTimestamp") == "" {
		md["creationTimestamp"] = timestamp(timeNow())
	}
	if res.Generation {
		if _, ok := int64Of(md["generation"]); !ok {
			md["generation"] = int64(1)
		}
	}
}

func jsonEqual(a, b any) bool { return reflect.DeepEqual(a, b) }
