package apiserver

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// notFound is kube-apiserver's answer for an unknown path.
func notFound() error {
	err := apierrors.NewNotFound(schema.GroupResource{}, "")
	err.ErrStatus.Message = "the server could not find the requested resource"
	err.ErrStatus.Details = &metav1.StatusDetails{}
	return err
}

// Discovery answers in the legacy (unaggregated) format with a plain JSON
// content type; clients asking for aggregated discovery fall back to it.
func (s *Server) serveCoreVersions(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, &metav1.APIVersions{
		TypeMeta: metav1.TypeMeta{Kind: "APIVersions"},
		Versions: []string{"v1"},
		ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{
			{ClientCIDR: "0.0.0.0/0", ServerAddress: "127.0.0.1:6443"},
		},
	})
}

func (s *Server) apiGroup(gv registry.GroupVersions) metav1.APIGroup {
	g := metav1.APIGroup{Name: gv.Group}
	for _, v := range gv.Versions {
		g.Versions = append(g.Versions, metav1.GroupVersionForDiscovery{
			GroupVersion: schema.GroupVersion{Group: gv.Group, Version: v}.String(), Version: v,
		})
	}
	g.PreferredVersion = g.Versions[0]
	return g
}

func (s *Server) serveGroups(w http.ResponseWriter, _ *http.Request) {
	list := &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{}}
	for _, gv := range s.reg.Groups() {
		if gv.Group == "" {
			continue
		}
		list.Groups = append(list.Groups, s.apiGroup(gv))
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) serveGroup(w http.ResponseWriter, _ *http.Request, group string) {
	for _, gv := range s.reg.Groups() {
		if gv.Group == group && group != "" {
			g := s.apiGroup(gv)
			g.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
			writeJSON(w, http.StatusOK, &g)
			return
		}
	}
	writeError(w, notFound())
}

// resourcesFor lists the discovery entries of one group version.
func (s *Server) resourcesFor(group, ver string) []metav1.APIResource {
	var out []metav1.APIResource
	for _, res := range s.reg.All() {
		if res.Group != group || res.Version != ver {
			continue
		}
		out = append(out, metav1.APIResource{
			Name:               res.Resource,
			SingularName:       res.Singular,
			Namespaced:         res.Namespaced,
			Kind:               res.Kind,
			Verbs:              res.Verbs(),
			ShortNames:         res.ShortNames,
			Categories:         res.Categories,
			StorageVersionHash: storageHash(res),
		})
		if res.Status {
			out = append(out, metav1.APIResource{Name: res.Resource + "/status", Namespaced: res.Namespaced, Kind: res.Kind, Verbs: []string{"get", "patch", "update"}})
		}
		for _, sub := range res.Subresources {
			switch sub {
			case "eviction":
				out = append(out, metav1.APIResource{Name: res.Resource + "/eviction", Namespaced: res.Namespaced, Group: "policy", Version: "v1", Kind: "Eviction", Verbs: []string{"create"}})
			case "token":
				out = append(out, metav1.APIResource{Name: res.Resource + "/token", Namespaced: res.Namespaced, Group: "authentication.k8s.io", Version: "v1", Kind: "TokenRequest", Verbs: []string{"create"}})
			}
		}
	}
	return out
}

func storageHash(res *registry.Resource) string {
	sum := sha256.Sum256([]byte(res.Group + "/" + res.Version + "/" + res.Kind))
	return strings.TrimRight(hex.EncodeToString(sum[:6]), "=")
}

func (s *Server) serveResourceList(w http.ResponseWriter, _ *http.Request, group, ver string) {
	resources := s.resourcesFor(group, ver)
	if resources == nil {
		writeError(w, notFound())
		return
	}
	writeJSON(w, http.StatusOK, &metav1.APIResourceList{
		TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
		GroupVersion: schema.GroupVersion{Group: group, Version: ver}.String(),
		APIResources: resources,
	})
}

// serveOpenAPIV3 publishes a minimal OpenAPI v3 document per group version:
// enough for kubectl to see that every kind accepts PATCH with the
// fieldValidation parameter (so it validates on the server) and which patch
// types each kind takes.
func (s *Server) serveOpenAPIV3(w http.ResponseWriter, _ *http.Request, sub string) {
	if sub == "" {
		paths := map[string]any{}
		for _, gv := range s.reg.Groups() {
			for _, v := range gv.Versions {
				p := "api/" + v
				if gv.Group != "" {
					p = "apis/" + gv.Group + "/" + v
				}
				paths[p] = map[string]string{"serverRelativeURL": "/openapi/v3/" + p + "?hash=" + s.openAPIHash(gv.Group, v)}
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"paths": paths})
		return
	}
	segs := strings.Split(sub, "/")
	var group, ver string
	switch {
	case len(segs) == 2 && segs[0] == "api":
		ver = segs[1]
	case len(segs) == 3 && segs[0] == "apis":
		group, ver = segs[1], segs[2]
	default:
		writeError(w, notFound())
		return
	}
	paths := map[string]any{}
	found := false
	for _, res := range s.reg.All() {
		if res.Group != group || res.Version != ver {
			continue
		}
		found = true
		content := map[string]any{
			"application/json-patch+json":  map[string]any{"schema": map[string]any{"type": "object"}},
			"application/merge-patch+json": map[string]any{"schema": map[string]any{"type": "object"}},
			"application/apply-patch+yaml": map[string]any{"schema": map[string]any{"type": "object"}},
		}
		if res.BuiltIn {
			content["application/strategic-merge-patch+json"] = map[string]any{"schema": map[string]any{"type": "object"}}
		}
		prefix := "/api/" + ver
		if group != "" {
			prefix = "/apis/" + group + "/" + ver
		}
		p := prefix + "/" + res.Resource + "/{name}"
		if res.Namespaced {
			p = prefix + "/namespaces/{namespace}/" + res.Resource + "/{name}"
		}
		paths[p] = map[string]any{
			"patch": map[string]any{
				"operationId":                     "patch" + res.Kind,
				"x-kubernetes-group-version-kind": map[string]string{"group": group, "version": ver, "kind": res.Kind},
				"parameters": []any{
					map[string]any{"name": "fieldValidation", "in": "query", "schema": map[string]any{"type": "string"}},
					map[string]any{"name": "dryRun", "in": "query", "schema": map[string]any{"type": "string"}},
					map[string]any{"name": "fieldManager", "in": "query", "schema": map[string]any{"type": "string"}},
				},
				"requestBody": map[string]any{"content": content, "required": true},
				"responses":   map[string]any{"200": map[string]any{"description": "OK"}},
			},
		}
	}
	if !found {
		writeError(w, notFound())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"openapi":    "3.0.0",
		"info":       map[string]string{"title": "Kubernetes", "version": versionInfo()["gitVersion"]},
		"paths":      paths,
		"components": map[string]any{"schemas": map[string]any{}},
	})
}

func (s *Server) openAPIHash(group, ver string) string {
	h := sha256.New()
	for _, r := range s.resourcesFor(group, ver) {
		h.Write([]byte(r.Name + r.Kind))
	}
	return strings.ToUpper(hex.EncodeToString(h.Sum(nil)[:16]))
}
