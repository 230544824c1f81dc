package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/managedfields"
	genericrequest "k8s.io/apiserver/pkg/endpoints/request"

	"github.com/nstance-dev/nstance/internal/devk8s/auth"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
	"github.com/nstance-dev/nstance/internal/devk8s/strategy"
)

// versionInfo is what /version reports.
func versionInfo() map[string]string {
	return map[string]string{
		"major":        "1",
		"minor":        "36",
		"gitVersion":   "v1.36.3-dev-k8s",
		"gitCommit":    "dev-k8s",
		"gitTreeState": "clean",
		"buildDate":    "2026-01-01T00:00:00Z",
		"goVersion":    "go1.26",
		"compiler":     "gc",
		"platform":     "linux/amd64",
	}
}

// Options configure a Server.
type Options struct {
	// Dir is the data directory.
	Dir string
	// CRDFiles are YAML or JSON files holding CRDs installed at start.
	CRDFiles []string
	// History and WatchBuffer tune the store (0 for defaults).
	History     int
	WatchBuffer int
	// BookmarkInterval is how often watches that allow bookmarks get one.
	BookmarkInterval time.Duration
	// TokenFile is an optional kube-apiserver static token file
	// (token,user,uid,"group1,group2") of extra users.
	TokenFile string
	// ClientCAFile turns on client certificate authentication against
	// this CA bundle (kube-apiserver's --client-ca-file); it is reloaded
	// when it changes and may be written after the server started. The
	// listener must request client certificates (app does).
	ClientCAFile string
	// Controllers turns on the work kube-controller-manager and kubelets do
	// in a real cluster: garbage collection, namespace deletion, finishing
	// graceful pod deletion and PodDisruptionBudget status. Off, dev-k8s
	// behaves like a bare kube-apiserver (as envtest does).
	Controllers bool
	// IgnoreCRDSchemas stores custom resources as they come, without their
	// CRD's validation, defaulting and pruning (only for benchmarks that
	// measure what the schemas cost).
	IgnoreCRDSchemas bool
}

// Server serves the Kubernetes API from a store.
type Server struct {
	log   logr.Logger
	reg   *registry.Registry
	store *store.Store
	opts  Options
	ctx   context.Context

	fmMu          sync.Mutex
	fieldManagers map[string]*managedfields.FieldManager
	builtinTypes  managedfields.TypeConverter

	scheme *runtime.Scheme
	codecs serializer.CodecFactory
	auth   *auth.Authenticator
	// requestInfo reads verbs and resources for the node rules.
	requestInfo *genericrequest.RequestInfoFactory

	// strategies are the built-in resources' rules; controllers those of
	// them that bring a controller, in strategy.Builtins order.
	strategies  map[schema.GroupResource]strategy.Strategy
	controllers []controller

	// gcMu serialises garbage collection passes.
	gcMu   sync.Mutex
	gcKick chan struct{}
	wg     sync.WaitGroup
}

// New opens the data directory, installs the CRDs and starts the garbage
// collector. Close releases everything.
func New(ctx context.Context, log logr.Logger, opts Options) (*Server, error) {
	if opts.BookmarkInterval <= 0 {
		opts.BookmarkInterval = time.Minute
	}
	scheme, err := buildScheme()
	if err != nil {
		return nil, err
	}
	s := &Server{log: log, reg: registry.New(strategy.Resources()...), opts: opts, ctx: ctx, gcKick: make(chan struct{}, 1), scheme: scheme, codecs: serializer.NewCodecFactory(scheme),
		fieldManagers: map[string]*managedfields.FieldManager{}, requestInfo: newRequestInfoFactory()}
	if opts.IgnoreCRDSchemas {
		s.reg.IgnoreSchemas()
	}
	s.strategies = map[schema.GroupResource]strategy.Strategy{}
	for _, b := range strategy.Builtins() {
		res := b.Resource()
		s.strategies[res.GroupResource()] = b
		if c, ok := b.(strategy.Controller); ok {
			s.controllers = append(s.controllers, controller{Controller: c, gvr: res.GVR()})
		}
	}
	authn, err := auth.New(ctx, auth.Options{
		StateDir:        filepath.Join(opts.Dir, store.StateDirName, "auth"),
		TokenFile:       opts.TokenFile,
		ServiceAccounts: s.serviceAccountUID,
		ClientCAFile:    opts.ClientCAFile,
		Log:             log.WithName("auth"),
	})
	if err != nil {
		return nil, err
	}
	s.auth = authn
	st, err := store.Open(ctx, log.WithName("store"), store.Options{
		Dir:         opts.Dir,
		History:     opts.History,
		WatchBuffer: opts.WatchBuffer,
		Normalize:   s.normalizeFile,
		Admit:       s.admitFileObject,
		OnChange:    s.onChange,
		ValidName:   s.validFileName,
	})
	if err != nil {
		return nil, err
	}
	s.store = st
	for _, res := range s.reg.All() {
		if err := st.Register(res.StorageName(), res.Namespaced); err != nil {
			_ = st.Close()
			return nil, fmt.Errorf("load %s: %w", res.StorageName(), err)
		}
	}
	if err := s.ensureNamespaces(); err != nil {
		_ = st.Close()
		return nil, err
	}
	if err := s.installCRDFiles(ctx, opts.CRDFiles); err != nil {
		_ = st.Close()
		return nil, err
	}
	s.wg.Add(1)
	go s.collector(ctx)
	return s, nil
}

// systemNamespaces exist in every cluster.
func systemNamespaces() []string {
	return []string{"default", "kube-system", "kube-public", "kube-node-lease"}
}

func (s *Server) ensureNamespaces() error {
	res, _ := s.reg.Lookup(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"})
	for _, ns := range systemNamespaces() {
		if _, ok := s.store.Get("namespaces", "", ns); ok {
			continue
		}
		obj := map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}
		if _, _, err := s.createObject(request{res: res}, obj, false); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	return nil
}

// Close stops background work and the store.
func (s *Server) Close() error {
	err := s.store.Close()
	close(s.gcKick)
	s.wg.Wait()
	return err
}

// StopWatches ends open watches so that a graceful HTTP shutdown does not
// wait for them.
func (s *Server) StopWatches() { s.store.StopWatches() }

// AdminToken is the bearer token of the generated admin user.
func (s *Server) AdminToken() string { return s.auth.AdminToken() }

// AuthMethods names the authenticators that are on.
func (s *Server) AuthMethods() []string { return s.auth.Methods() }

// serviceAccountUID resolves a ServiceAccount for token authentication; one
// being deleted no longer authenticates, as in kube-apiserver.
func (s *Server) serviceAccountUID(namespace, name string) (string, bool) {
	e, ok := s.store.Get("serviceaccounts", namespace, name)
	if !ok || hasDeletionTimestamp(e.Object) {
		return "", false
	}
	return str(metaOf(e.Object), "uid"), true
}

// Registry exposes the resource table.
func (s *Server) Registry() *registry.Registry { return s.reg }

// onChange reacts to committed changes: CRDs register their kinds, and
// deletions wake the garbage collector.
func (s *Server) onChange(ev store.Event) {
	if ev.Resource == crdStorage {
		s.crdChanged(ev)
	}
	if ev.Type == "DELETED" || hasDeletionTimestamp(ev.Object.Object) || s.controllerWakes(ev) {
		s.kickGC()
	}
}

func (s *Server) kickGC() {
	defer func() { _ = recover() }() // closed during shutdown
	select {
	case s.gcKick <- struct{}{}:
	default:
	}
}

// ServeHTTP authenticates and routes a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if rec := recover(); rec != nil {
			s.log.Error(fmt.Errorf("%v", rec), "panic serving request", "method", r.Method, "path", r.URL.Path,
				"stack", string(debug.Stack()))
			writeError(w, apierrors.NewInternalError(fmt.Errorf("%v", rec)))
		}
	}()
	u, err := s.auth.Authenticate(r)
	if err != nil {
		s.log.V(1).Info("unauthorized request", "method", r.Method, "path", r.URL.Path, "reason", err.Error())
		writeError(w, apierrors.NewUnauthorized("Unauthorized"))
		return
	}
	if !s.authorizeNode(w, r, u) {
		return
	}
	r = r.WithContext(auth.WithUser(r.Context(), u))
	path := strings.Trim(r.URL.Path, "/")
	switch path {
	case "version":
		writeJSON(w, http.StatusOK, versionInfo())
		return
	case "healthz", "readyz", "livez":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok"))
		return
	case "api":
		if wantsAggregated(r) {
			s.writeAggregated(w, true)
			return
		}
		s.serveCoreVersions(w, r)
		return
	case selfSubjectReviewPath:
		s.selfSubjectReview(w, r)
		return
	case "apis":
		if wantsAggregated(r) {
			s.writeAggregated(w, false)
			return
		}
		s.serveGroups(w, r)
		return
	}
	if strings.HasPrefix(path, "healthz/") || strings.HasPrefix(path, "readyz/") || strings.HasPrefix(path, "livez/") {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok"))
		return
	}
	if path == "openapi/v3" || strings.HasPrefix(path, "openapi/v3/") {
		s.serveOpenAPIV3(w, r, strings.TrimPrefix(strings.TrimPrefix(path, "openapi/v3"), "/"))
		return
	}
	segs := strings.Split(path, "/")
	var group, ver string
	var rest []string
	switch {
	case segs[0] == "api" && len(segs) >= 2:
		ver, rest = segs[1], segs[2:]
	case segs[0] == "apis" && len(segs) == 2:
		s.serveGroup(w, r, segs[1])
		return
	case segs[0] == "apis" && len(segs) >= 3:
		group, ver, rest = segs[1], segs[2], segs[3:]
	default:
		writeError(w, apierrors.NewNotFound(schema.GroupResource{}, ""))
		return
	}
	if len(rest) == 0 {
		s.serveResourceList(w, r, group, ver)
		return
	}
	s.serveResource(w, r, group, ver, rest)
}

// writeJSON encodes v with the given status.
func writeJSON(w http.ResponseWriter, code int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		code = http.StatusInternalServerError
		data = []byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"encode response","code":500}`)
	}
	writeRaw(w, code, data)
}

func writeRaw(w http.ResponseWriter, code int, data []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(data)
}

// writeError answers with a metav1.Status body.
func writeError(w http.ResponseWriter, err error) {
	var st *apierrors.StatusError
	if !errors.As(err, &st) {
		st = apierrors.NewInternalError(err)
	}
	status := st.ErrStatus
	status.Kind = "Status"
	status.APIVersion = "v1"
	code := int(status.Code)
	if code == 0 {
		code = http.StatusInternalServerError
	}
	writeJSON(w, code, &status)
}

func successStatus(details *metav1.StatusDetails) *metav1.Status {
	return &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess, Details: details}
}
