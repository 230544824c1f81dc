package difftest

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

const testGroup = "test.nstance.dev"

func testCRD(plural, kind string, namespaced, status bool) map[string]any {
	scope := "Cluster"
	if namespaced {
		scope = "Namespaced"
	}
	version := map[string]any{
		"name": "v1", "served": true, "storage": true,
		"schema": map[string]any{"openAPIV3Schema": map[string]any{
			"type": "object",
			"properties": map[string]any{
				"spec":   map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true},
				"status": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true},
			},
		}},
		"additionalPrinterColumns": []any{
			map[string]any{"name": "Color", "type": "string", "jsonPath": ".spec.color"},
			map[string]any{"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
		},
	}
	if status {
		version["subresources"] = map[string]any{"status": map[string]any{}}
	}
	return map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": plural + "." + testGroup},
		"spec": map[string]any{
			"group": testGroup,
			"names": map[string]any{"plural": plural, "singular": strings.ToLower(kind), "kind": kind, "listKind": kind + "List"},
			"scope": scope, "versions": []any{version},
		},
	}
}

// installTestCRDs adds a namespaced kind with a status subresource
// (widgets) and a cluster-scoped one without (gadgets), then waits until
// both are served.
func installTestCRDs(tg *target) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, crd := range append([]map[string]any{
		testCRD("widgets", "Widget", true, true),
		testCRD("gadgets", "Gadget", false, false),
	}, schemaCRDs()...) {
		r, err := tg.do(ctx, http.MethodPost, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "", crd, "")
		if err != nil {
			return err
		}
		if r.Code != http.StatusCreated {
			return fmt.Errorf("%s: create CRD: %d %s", tg.name, r.Code, r.Raw)
		}
	}
	for {
		ok := true
		for _, p := range []string{"/apis/" + testGroup + "/v1/widgets", "/apis/" + testGroup + "/v1/gadgets",
			"/apis/" + testGroup + "/v1/sprockets", "/apis/" + testGroup + "/v1beta1/sprockets", "/apis/" + testGroup + "/v1/gizmos"} {
			r, err := tg.do(ctx, http.MethodGet, p, "", nil, "")
			if err != nil || r.Code != http.StatusOK {
				ok = false
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: test CRDs not served in time", tg.name)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
