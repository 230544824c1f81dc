package apiserver

import (
	"encoding/json"
	"net/http"
	"strings"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

const aggregatedContentType = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

// wantsAggregated reports an Accept header asking for aggregated discovery
// (apidiscovery.k8s.io/v2), as kubectl and client-go do by default.
func wantsAggregated(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		if strings.Contains(part, "g=apidiscovery.k8s.io") && strings.Contains(part, "v=v2") &&
			!strings.Contains(part, "v=v2beta1") && strings.Contains(part, "as=APIGroupDiscoveryList") {
			return true
		}
	}
	return false
}

// aggregated builds the discovery document for the core group (core true,
// served at /api) or for every other group (served at /apis).
func (s *Server) aggregated(core bool) *apidiscoveryv2.APIGroupDiscoveryList {
	list := &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupDiscoveryList", APIVersion: "apidiscovery.k8s.io/v2"}}
	for _, gv := range s.reg.Groups() {
		if (gv.Group == "") != core {
			continue
		}
		g := apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: gv.Group}}
		for _, v := range gv.Versions {
			vd := apidiscoveryv2.APIVersionDiscovery{Version: v, Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent}
			for _, res := range s.reg.All() {
				if res.Group != gv.Group || res.Version != v {
					continue
				}
				vd.Resources = append(vd.Resources, resourceDiscovery(res))
			}
			g.Versions = append(g.Versions, vd)
		}
		list.Items = append(list.Items, g)
	}
	return list
}

func resourceDiscovery(res *registry.Resource) apidiscoveryv2.APIResourceDiscovery {
	scope := apidiscoveryv2.ScopeCluster
	if res.Namespaced {
		scope = apidiscoveryv2.ScopeNamespace
	}
	gvk := res.GVK()
	rd := apidiscoveryv2.APIResourceDiscovery{
		Resource:         res.Resource,
		ResponseKind:     &metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind},
		Scope:            scope,
		SingularResource: res.Singular,
		Verbs:            res.Verbs(),
		ShortNames:       res.ShortNames,
		Categories:       res.Categories,
	}
	if res.BuiltIn {
		// kube-apiserver leaves the enclosing group and version implied
		// for built-in kinds and spells them out for custom resources.
		rd.ResponseKind = &metav1.GroupVersionKind{Kind: gvk.Kind}
	}
	if res.Status {
		rd.Subresources = append(rd.Subresources, apidiscoveryv2.APISubresourceDiscovery{
			Subresource: "status", ResponseKind: rd.ResponseKind, Verbs: []string{"get", "patch", "update"},
		})
	}
	for _, sub := range res.Subresources {
		switch sub {
		case "eviction":
			rd.Subresources = append(rd.Subresources, apidiscoveryv2.APISubresourceDiscovery{
				Subresource: "eviction", ResponseKind: &metav1.GroupVersionKind{Group: "policy", Version: "v1", Kind: "Eviction"}, Verbs: []string{"create"},
			})
		case "token":
			rd.Subresources = append(rd.Subresources, apidiscoveryv2.APISubresourceDiscovery{
				Subresource: "token", ResponseKind: &metav1.GroupVersionKind{Group: "authentication.k8s.io", Version: "v1", Kind: "TokenRequest"}, Verbs: []string{"create"},
			})
		}
	}
	return rd
}

func (s *Server) writeAggregated(w http.ResponseWriter, core bool) {
	data, err := json.Marshal(s.aggregated(core))
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", aggregatedContentType)
	w.Header().Set("Vary", "Accept")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(data)
}
