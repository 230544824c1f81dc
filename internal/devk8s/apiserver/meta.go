package apiserver

import (
	"crypto/rand"
	"fmt"
	"math/big"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/strategy"
)

// Helpers over unstructured (map) objects; the object package has them
// for the strategies too.

func metaOf(obj map[string]any) map[string]any { return object.Meta(obj) }

func str(m map[string]any, k string) string { return object.Str(m, k) }

func nestedString(obj map[string]any, path ...string) string {
	return object.NestedString(obj, path...)
}

func stringMap(v any) map[string]string { return object.StringMap(v) }

func finalizers(md map[string]any) []string { return object.Finalizers(md) }

func setFinalizers(md map[string]any, fs []string) {
	if len(fs) == 0 {
		delete(md, "finalizers")
		return
	}
	raw := make([]any, len(fs))
	for i, f := range fs {
		raw[i] = f
	}
	md["finalizers"] = raw
}

func hasDeletionTimestamp(obj map[string]any) bool { return object.HasDeletionTimestamp(obj) }

func int64Of(v any) (int64, bool) { return object.Int64(v) }

func timestamp(t time.Time) string { return object.Timestamp(t) }

const nameChars = "bcdfghjklmnpqrstvwxz2456789"

// generateName appends five random characters as kube-apiserver does.
func generateName(base string) string {
	if len(base) > 58 {
		base = base[:58]
	}
	b := make([]byte, 5)
	for i := range b {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(nameChars))))
		if err != nil {
			panic(fmt.Sprintf("random name: %v", err))
		}
		b[i] = nameChars[n.Int64()]
	}
	return base + string(b)
}

func specChanged(a, b map[string]any) bool { return object.SpecChanged(a, b) }

func generationOf(md map[string]any) int64 { return object.Generation(md) }

// tidyMeta drops empty metadata collections, as encoding ObjectMeta does.
func tidyMeta(obj map[string]any) {
	md := metaOf(obj)
	for _, k := range []string{"labels", "annotations", "finalizers", "ownerReferences"} {
		switch v := md[k].(type) {
		case map[string]any:
			if len(v) == 0 {
				delete(md, k)
			}
		case []any:
			if len(v) == 0 {
				delete(md, k)
			}
		case nil:
			delete(md, k)
		}
	}
}

// prepareCreate fills server-managed fields of a new object.
func (s *Server) prepareCreate(res *registry.Resource, obj map[string]any, now time.Time) {
	tidyMeta(obj)
	md := metaOf(obj)
	md["uid"] = string(uuid.NewUUID())
	md["creationTimestamp"] = timestamp(now)
	delete(md, "resourceVersion")
	delete(md, "deletionTimestamp")
	delete(md, "deletionGracePeriodSeconds")
	delete(md, "selfLink")
	if res.Generation {
		md["generation"] = int64(1)
	} else {
		delete(md, "generation")
	}
	obj["apiVersion"] = res.APIVersion()
	obj["kind"] = res.Kind
	if res.Status && !res.BuiltIn {
		delete(obj, "status")
	}
	s.strategy(res).PrepareForCreate(res, obj)
}

// prepareUpdate computes the stored object for an update of cur to obj
// through the main resource (sub "") or the status subresource.
func (s *Server) prepareUpdate(res *registry.Resource, sub string, cur, obj map[string]any) map[string]any {
	var next map[string]any
	bump := false
	st := s.strategy(res)
	su, statusStrategy := st.(strategy.StatusUpdater)
	switch {
	case sub == "status" && statusStrategy:
		next = su.PrepareForStatusUpdate(cur, obj)
	case sub == "status":
		next = deepCopy(cur)
		if st, ok := obj["status"]; ok {
			next["status"] = st
		} else {
			delete(next, "status")
		}
		return next
	default:
		if sub == "" {
			bump = st.PrepareForUpdate(res, cur, obj)
		}
		next = obj
		if res.Status {
			if st, ok := cur["status"]; ok {
				next["status"] = st
			} else {
				delete(next, "status")
			}
		}
	}
	md, cmd := metaOf(next), metaOf(cur)
	for _, k := range []string{"uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation", "name", "namespace"} {
		if v, ok := cmd[k]; ok {
			md[k] = v
		} else {
			delete(md, k)
		}
	}
	delete(md, "selfLink")
	if _, ok := md["managedFields"]; !ok {
		if mf, ok := cmd["managedFields"]; ok {
			md["managedFields"] = mf
		}
	}
	next["apiVersion"] = res.APIVersion()
	next["kind"] = res.Kind
	if res.Generation && (bump || specChanged(cur, next) || (!res.Status && !jsonEqual(cur["status"], next["status"]))) {
		md["generation"] = generationOf(cmd) + 1
	}
	return next
}

func rvOf(obj map[string]any) string {
	return str(metaOf(obj), "resourceVersion")
}

func parseRV(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	return strconv.ParseUint(s, 10, 64)
}

func schemaGK(group, kind string) schema.GroupKind {
	return schema.GroupKind{Group: group, Kind: kind}
}
