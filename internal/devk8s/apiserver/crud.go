package apiserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/nstance-dev/nstance/internal/devk8s/auth"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
)

const maxBody = 3 << 20

// request is one parsed resource request.
type request struct {
	res       *registry.Resource
	namespace string
	name      string
	sub       string
	// manager is the field manager recorded in managedFields ("" for
	// dev-k8s's own controllers, which leave managedFields alone).
	manager string
	// applied is set when managedFields were already computed by apply.
	applied bool
	// strict is set for fieldValidation=Strict (custom resources refuse
	// unknown fields instead of pruning them).
	strict bool
	// user made the request (nil for dev-k8s's own controllers).
	user user.Info
}

func (s *Server) serveResource(w http.ResponseWriter, r *http.Request, group, ver string, rest []string) {
	var rq request
	if rest[0] == "namespaces" && len(rest) >= 3 && !(len(rest) == 3 && (rest[2] == "status" || rest[2] == "finalize")) {
		rq.namespace, rest = rest[1], rest[2:]
	}
	if len(rest) > 3 {
		writeError(w, notFound())
		return
	}
	res, ok := s.reg.Lookup(schema.GroupVersionResource{Group: group, Version: ver, Resource: rest[0]})
	// A new CRD's resource is in the registry (its schema admits the files
	// being loaded) a moment before the store has loaded them: until then
	// it is not served, as kube-apiserver serves a CRD once established.
	if !ok || (!res.Namespaced && rq.namespace != "") || !s.store.Registered(res.StorageName()) {
		if !s.reg.BuiltInGroup(group) {
			// Custom resource groups answer like apiextensions-apiserver.
			http.NotFound(w, r)
			return
		}
		writeError(w, notFound())
		return
	}
	rq.res = res
	rq.user, _ = auth.UserFrom(r.Context())
	rq.manager = managerName(r)
	rq.strict = isStrict(r.URL.Query().Get("fieldValidation"))
	if len(rest) >= 2 {
		rq.name = rest[1]
	}
	if len(rest) == 3 {
		rq.sub = rest[2]
		if !s.hasSub(res, rq.sub) {
			if res.Schema != nil {
				// apiextensions-apiserver names the object.
				writeError(w, apierrors.NewNotFound(res.GroupResource(), rq.name))
				return
			}
			writeError(w, notFound())
			return
		}
	}
	if res.Namespaced && rq.name != "" && rq.namespace == "" {
		writeError(w, notFound())
		return
	}
	if err := checkURLNames(r, rq); err != nil {
		writeError(w, err)
		return
	}
	switch r.Method {
	case http.MethodGet:
		switch {
		case rq.name == "" && isTrue(r.URL.Query().Get("watch")):
			s.watch(w, r, rq)
		case rq.name == "":
			s.list(w, r, rq)
		case rq.sub == "" || rq.sub == "status":
			s.get(w, r, rq)
		default:
			writeError(w, methodNotAllowed(r, rq))
		}
	case http.MethodPost:
		switch {
		case rq.name == "":
			s.create(w, r, rq)
		case rq.sub == "eviction" || rq.sub == "token":
			// Subresource creates pass namespace admission first.
			if err := s.checkNamespace(rq.res, rq.namespace, false); err != nil {
				writeError(w, err)
				return
			}
			if rq.sub == "eviction" {
				s.evict(w, r, rq)
			} else {
				s.token(w, r, rq)
			}
		default:
			writeError(w, methodNotAllowed(r, rq))
		}
	case http.MethodPut:
		if rq.name == "" || (rq.sub != "" && rq.sub != "status") {
			writeError(w, methodNotAllowed(r, rq))
			return
		}
		s.update(w, r, rq)
	case http.MethodPatch:
		if rq.name == "" || (rq.sub != "" && rq.sub != "status") {
			writeError(w, methodNotAllowed(r, rq))
			return
		}
		s.patch(w, r, rq)
	case http.MethodDelete:
		switch {
		case rq.name == "":
			s.deleteCollection(w, r, rq)
		case rq.sub == "":
			s.delete(w, r, rq)
		default:
			writeError(w, methodNotAllowed(r, rq))
		}
	default:
		writeError(w, methodNotAllowed(r, rq))
	}
}

func methodNotAllowed(r *http.Request, rq request) error {
	return apierrors.NewMethodNotSupported(rq.res.GroupResource(), strings.ToLower(r.Method))
}

func (s *Server) hasSub(res *registry.Resource, sub string) bool {
	if sub == "status" {
		return res.Status
	}
	for _, x := range res.Subresources {
		if x == sub {
			return true
		}
	}
	return false
}

func isTrue(v string) bool { return v == "true" || v == "1" }

func isDryRun(r *http.Request) bool {
	for _, v := range r.URL.Query()["dryRun"] {
		if v == "All" {
			return true
		}
	}
	return false
}

// readObject decodes a JSON object body.
func readBody(r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("read request body: %v", err))
	}
	if len(data) > maxBody {
		return nil, apierrors.NewRequestEntityTooLargeError("limit is 3145728")
	}
	return data, nil
}

func decodeBody(data []byte) (map[string]any, error) {
	var obj map[string]any
	if err := utiljson.Unmarshal(data, &obj); err != nil || obj == nil {
		msg := "the request body is not a JSON object"
		if err != nil {
			msg = err.Error()
		}
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the object provided is unrecognized (must be of type JSON): %s", msg))
	}
	return obj, nil
}

func (s *Server) readObject(r *http.Request, res *registry.Resource) (map[string]any, error) {
	obj, err := s.readMap(r)
	if err != nil {
		return nil, err
	}
	return obj, checkTypeMeta(obj, res)
}

// readMap decodes a request body sent as JSON, YAML or (for built-in
// kinds, as kubectl does) Kubernetes protobuf.
func (s *Server) readMap(r *http.Request) (map[string]any, error) {
	data, err := readBody(r)
	if err != nil {
		return nil, err
	}
	ct := r.Header.Get("Content-Type")
	if i := strings.Index(ct, ";"); i > 0 {
		ct = ct[:i]
	}
	switch strings.TrimSpace(ct) {
	case "", "application/json", "*/*":
	case "application/yaml":
		if data, err = yamlToJSON(data); err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
	case "application/vnd.kubernetes.protobuf":
		typed, _, err := s.codecs.UniversalDeserializer().Decode(data, nil, nil)
		if err != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("decode protobuf body: %v", err))
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		if gvk := typed.GetObjectKind().GroupVersionKind(); !gvk.Empty() {
			obj["apiVersion"], obj["kind"] = gvk.GroupVersion().String(), gvk.Kind
		}
		return obj, nil
	default:
		return nil, unsupportedMediaType([]string{"application/json", "application/yaml", "application/vnd.kubernetes.protobuf"})
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return map[string]any{}, nil
	}
	return decodeBody(data)
}

func checkTypeMeta(obj map[string]any, res *registry.Resource) error {
	if av := str(obj, "apiVersion"); av != "" && av != res.APIVersion() {
		gv, err := schema.ParseGroupVersion(av)
		if err != nil || gv.Group != res.Group {
			return apierrors.NewBadRequest(fmt.Sprintf("the API version in the data (%s) does not match the expected API version (%s)", av, res.APIVersion()))
		}
	}
	if k := str(obj, "kind"); k != "" && k != res.Kind {
		return apierrors.NewBadRequest(fmt.Sprintf("the kind in the data (%s) does not match the expected kind (%s)", k, res.Kind))
	}
	return nil
}

// entryBytes renders a stored object in the requested version.
func entryBytes(res *registry.Resource, e *store.Entry) []byte {
	if data, ok := crEntryBytes(res, e); ok {
		return data
	}
	if str(e.Object, "apiVersion") == res.APIVersion() {
		return e.JSON
	}
	obj := deepCopy(e.Object)
	obj["apiVersion"] = res.APIVersion()
	data, _ := json.Marshal(obj)
	return data
}

func deepCopy(obj map[string]any) map[string]any {
	if obj == nil {
		return nil
	}
	return runtime.DeepCopyJSON(obj)
}

func (s *Server) writeEntry(w http.ResponseWriter, r *http.Request, code int, res *registry.Resource, e *store.Entry) {
	if wantsTable(r) {
		t, err := s.table(res, []*store.Entry{e}, "", r)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, code, t)
		return
	}
	writeRaw(w, code, entryBytes(res, e))
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, rq request) {
	e, ok := s.store.Get(rq.res.StorageName(), rq.namespace, rq.name)
	if !ok {
		writeError(w, apierrors.NewNotFound(rq.res.GroupResource(), rq.name))
		return
	}
	s.writeEntry(w, r, http.StatusOK, rq.res, e)
}

// checkNamespace fails when the namespace of a namespaced object is missing
// or being deleted.
func (s *Server) checkNamespace(res *registry.Resource, ns string, creating bool) error {
	return s.checkNamespaceFor(res, ns, "", creating)
}

func (s *Server) checkNamespaceFor(res *registry.Resource, ns, name string, creating bool) error {
	if !res.Namespaced {
		return nil
	}
	e, ok := s.store.Get("namespaces", "", ns)
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, ns)
	}
	if creating && hasDeletionTimestamp(e.Object) {
		err := apierrors.NewForbidden(res.GroupResource(), name, fmt.Errorf("unable to create new content in namespace %s because it is being terminated", ns))
		err.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: "NamespaceTerminating", Message: fmt.Sprintf("namespace %s is being terminated", ns), Field: "metadata.namespace"}}
		return err
	}
	return nil
}

// admitObject checks and fixes the namespace and name of an incoming object.
func admitObject(rq request, obj map[string]any) error {
	md := metaOf(obj)
	if rq.res.Namespaced {
		if ns := str(md, "namespace"); ns != "" && ns != rq.namespace {
			return apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request")
		}
		md["namespace"] = rq.namespace
	} else {
		delete(md, "namespace")
	}
	return nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, rq request) {
	obj, err := s.readObject(r, rq.res)
	if err == nil {
		err = admitObject(rq, obj)
	}
	if err == nil {
		err = s.admitNodeCreate(r, rq, obj)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	code, out, err := s.createObject(rq, obj, isDryRun(r))
	if err != nil {
		writeError(w, err)
		return
	}
	s.writeEntry(w, r, code, rq.res, out)
}

// createObject stores a new object (admitObject already ran).
func (s *Server) createObject(rq request, obj map[string]any, dryRun bool) (int, *store.Entry, error) {
	md := metaOf(obj)
	name := str(md, "name")
	if name == "" {
		gen := str(md, "generateName")
		if gen == "" {
			return 0, nil, apierrors.NewInvalid(rq.res.GVK().GroupKind(), "", field.ErrorList{field.Required(field.NewPath("metadata", "name"), "name or generateName is required")})
		}
		// A generated name that is taken is drawn again, as kube-apiserver
		// does, a few times before giving up.
		var code int
		var out *store.Entry
		var err error
		for attempt := 0; attempt < 8; attempt++ {
			attemptObj := deepCopy(obj)
			metaOf(attemptObj)["name"] = generateName(gen)
			code, out, err = s.createObject(rq, attemptObj, dryRun)
			if !apierrors.IsAlreadyExists(err) {
				break
			}
		}
		return code, out, err
	}
	// The namespace first, as kube-apiserver's NamespaceLifecycle admission
	// runs before validation.
	if err := s.checkNamespaceFor(rq.res, rq.namespace, name, true); err != nil {
		return 0, nil, err
	}
	s.prepareCreate(rq.res, obj, time.Now())
	var err error
	if rq.res.Schema != nil {
		if obj, err = s.crCreate(rq, obj); err != nil {
			return 0, nil, err
		}
	} else {
		if err := s.validateNewMeta(rq.res, obj); err != nil {
			return 0, nil, err
		}
		if obj, err = s.roundTrip(rq.res, obj); err != nil {
			return 0, nil, err
		}
		if err := s.validate(rq.res, nil, obj); err != nil {
			return 0, nil, err
		}
	}
	obj = s.trackUpdate(rq.res, "", nil, obj, rq.manager)
	if err := crStore(rq.res, obj); err != nil {
		return 0, nil, err
	}
	if dryRun {
		if _, exists := s.store.Get(rq.res.StorageName(), rq.namespace, name); exists {
			return 0, nil, apierrors.NewAlreadyExists(rq.res.GroupResource(), name)
		}
		e, err := entryOf(obj)
		return http.StatusCreated, e, err
	}
	result, err := s.store.Mutate(rq.res.StorageName(), rq.namespace, name, func(cur map[string]any) (store.Mutation, error) {
		if cur != nil {
			return store.Mutation{}, apierrors.NewAlreadyExists(rq.res.GroupResource(), name)
		}
		return store.Mutation{Object: obj}, nil
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, result.Entry, nil
}

func dryRunFunc(dry bool, fn store.MutateFunc) store.MutateFunc {
	return func(cur map[string]any) (store.Mutation, error) {
		m, err := fn(cur)
		m.DryRun = dry
		return m, err
	}
}

func entryOf(obj map[string]any) (*store.Entry, error) {
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encode object: %w", err)
	}
	return &store.Entry{Object: obj, JSON: data}, nil
}

func conflict(res *registry.Resource, name string) error {
	return apierrors.NewConflict(res.GroupResource(), name, errors.New("the object has been modified; please apply your changes to the latest version and try again"))
}

func (s *Server) update(w http.ResponseWriter, r *http.Request, rq request) {
	obj, err := s.readObject(r, rq.res)
	if err == nil {
		err = admitObject(rq, obj)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	md := metaOf(obj)
	if n := str(md, "name"); n != rq.name {
		writeError(w, apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", n, rq.name)))
		return
	}
	created := false
	// Checked before taking the store lock; used only if PUT creates.
	nsErr := s.checkNamespace(rq.res, rq.namespace, true)
	result, err := s.store.Mutate(rq.res.StorageName(), rq.namespace, rq.name, dryRunFunc(isDryRun(r), func(cur map[string]any) (store.Mutation, error) {
		if cur == nil {
			if !rq.res.CreateOnUpdate || rq.sub != "" {
				return store.Mutation{}, apierrors.NewNotFound(rq.res.GroupResource(), rq.name)
			}
			if nsErr != nil {
				return store.Mutation{}, nsErr
			}
			s.prepareCreate(rq.res, obj, time.Now())
			if err := s.validateNewMeta(rq.res, obj); err != nil {
				return store.Mutation{}, err
			}
			created = true
			obj, err := s.roundTrip(rq.res, obj)
			if err != nil {
				return store.Mutation{}, err
			}
			if err := s.validate(rq.res, nil, obj); err != nil {
				return store.Mutation{}, err
			}
			return store.Mutation{Object: s.trackUpdate(rq.res, "", nil, obj, rq.manager)}, nil
		}
		cur, err := crRead(rq.res, cur)
		if err != nil {
			return store.Mutation{}, err
		}
		rv := str(md, "resourceVersion")
		if rv == "" && !rq.res.BuiltIn {
			gk := schemaGK(rq.res.Group, rq.res.Resource) // kube names custom resources by plural here
			return store.Mutation{}, apierrors.NewInvalid(gk, rq.name, field.ErrorList{field.Invalid(field.NewPath("metadata", "resourceVersion"), int64(0), "must be specified for an update")})
		}
		if rv != "" && rv != rvOf(cur) {
			return store.Mutation{}, conflict(rq.res, rq.name)
		}
		return s.finishUpdate(rq, cur, s.prepareUpdate(rq.res, rq.sub, cur, obj))
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

// finishUpdate validates an updated object and turns "deleting with no
// finalizers left" into the final deletion.
func (s *Server) finishUpdate(rq request, cur, next map[string]any) (store.Mutation, error) {
	if err := admitNodeUpdate(rq, cur, next); err != nil {
		return store.Mutation{}, err
	}
	tidyMeta(next)
	var err error
	if rq.res.Schema != nil {
		if next, err = s.crUpdate(rq, cur, next); err != nil {
			return store.Mutation{}, err
		}
	} else {
		if next, err = s.roundTrip(rq.res, next); err != nil {
			return store.Mutation{}, err
		}
		if err := s.validate(rq.res, cur, next); err != nil {
			return store.Mutation{}, err
		}
	}
	if !rq.applied {
		next = s.trackUpdate(rq.res, rq.sub, cur, next, rq.manager)
	}
	if err := crStore(rq.res, next); err != nil {
		return store.Mutation{}, err
	}
	if hasDeletionTimestamp(cur) {
		old := map[string]bool{}
		for _, f := range finalizers(metaOf(cur)) {
			old[f] = true
		}
		for _, f := range finalizers(metaOf(next)) {
			if !old[f] {
				return store.Mutation{}, apierrors.NewInvalid(rq.res.GVK().GroupKind(), rq.name, field.ErrorList{field.Forbidden(field.NewPath("metadata", "finalizers"), "no new finalizers can be added if the object is being deleted, found new finalizers []string{\""+f+"\"}")})
			}
		}
		if len(finalizers(metaOf(next))) == 0 && !s.waitsForGracePeriod(rq.res, next) {
			return store.Mutation{Object: next, Delete: true}, nil
		}
	}
	return store.Mutation{Object: next}, nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, rq request) {
	q := r.URL.Query()
	sel, err := s.parseSelectors(rq.res, q.Get("labelSelector"), q.Get("fieldSelector"))
	if err != nil {
		writeError(w, err)
		return
	}
	entries, rv := s.store.List(rq.res.StorageName(), rq.namespace)
	limit, start, err := pagination(q.Get("limit"), q.Get("continue"))
	if err != nil {
		writeError(w, err)
		return
	}
	if start != "" {
		if _, err := decodeContinue(q.Get("continue")); err != nil {
			writeError(w, err)
			return
		}
	}
	var items []*store.Entry
	next := ""
	remaining := int64(0)
	for i, e := range entries {
		k := entryKey(e)
		if start != "" && k < start {
			continue
		}
		if limit > 0 && int64(len(items)) == limit {
			next = encodeContinue(rv, k)
			remaining = int64(len(entries) - i)
			break
		}
		if sel.matches(e.Object) {
			items = append(items, e)
		}
	}
	if wantsTable(r) {
		t, err := s.table(rq.res, items, next, r)
		if err != nil {
			writeError(w, err)
			return
		}
		t.ResourceVersion = fmt.Sprint(rv)
		writeJSON(w, http.StatusOK, t)
		return
	}
	var buf bytes.Buffer
	buf.Grow(64 + len(items)*512)
	fmt.Fprintf(&buf, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"%d"`, rq.res.ListKind, rq.res.APIVersion(), rv)
	if next != "" {
		fmt.Fprintf(&buf, `,"continue":%q`, next)
		if sel.empty() {
			fmt.Fprintf(&buf, `,"remainingItemCount":%d`, remaining)
		}
	}
	buf.WriteString(`},"items":[`)
	for i, e := range items {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(entryBytes(rq.res, e))
	}
	buf.WriteString("]}")
	writeRaw(w, http.StatusOK, buf.Bytes())
}

func entryKey(e *store.Entry) string {
	md, _ := e.Object["metadata"].(map[string]any)
	ns, name := str(md, "namespace"), str(md, "name")
	if ns == "" {
		return name
	}
	return ns + "/" + name
}
