package crschema

import (
	"fmt"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/controller/openapi/builder"
	generatedopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/managedfields"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/kube-openapi/pkg/builder3"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/spec3"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// Static holds the built-in OpenAPI definitions (ObjectMeta and what it
// uses) that CRD schemas refer to; kube-apiserver merges them with each
// CRD's OpenAPI to type server-side apply.
type Static struct {
	schemas map[string]*spec.Schema
}

// NewStatic builds the static definitions as the generic API server does
// for the apiextensions group.
func NewStatic() (*Static, error) {
	scheme := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	namer := openapinamer.NewDefinitionNamer(scheme)
	cfg := &common.OpenAPIV3Config{
		GetDefinitions:    generatedopenapi.GetOpenAPIDefinitions,
		GetDefinitionName: namer.GetDefinitionName,
	}
	schemas, err := builder3.BuildOpenAPIDefinitionsForResources(cfg, apiextensionsv1.CustomResourceDefinition{}.OpenAPIModelName())
	if err != nil {
		return nil, fmt.Errorf("build static OpenAPI definitions: %w", err)
	}
	return &Static{schemas: schemas}, nil
}

// typeConverter types server-side apply for a CRD from its schemas, as
// kube-apiserver's CRD handler does (buildOpenAPIModelsForApply).
func typeConverter(static *Static, crd *apiextensionsv1.CustomResourceDefinition) (managedfields.TypeConverter, error) {
	if static == nil {
		return managedfields.NewDeducedTypeConverter(), nil
	}
	specs := []*spec3.OpenAPI{{
		Version:    "3.0.0",
		Info:       &spec.Info{InfoProps: spec.InfoProps{Title: "Kubernetes CRD Swagger", Version: "v0.1.0"}},
		Components: &spec3.Components{Schemas: static.schemas},
	}}
	for _, v := range crd.Spec.Versions {
		s, err := builder.BuildOpenAPIV3(crd, v.Name, builder.Options{})
		if err != nil {
			return nil, fmt.Errorf("build OpenAPI of %s version %s: %w", crd.Name, v.Name, err)
		}
		specs = append(specs, s)
	}
	merged, err := builder.MergeSpecsV3(specs...)
	if err != nil {
		return nil, fmt.Errorf("merge OpenAPI of %s: %w", crd.Name, err)
	}
	return managedfields.NewTypeConverter(merged.Components.Schemas, crd.Spec.PreserveUnknownFields)
}
