package apiserver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
)

const (
	crdStorage   = "customresourcedefinitions"
	crdFinalizer = "customresourcecleanup.apiextensions.k8s.io"
)

func (s *Server) crdResource() *registry.Resource {
	res, _ := s.reg.Lookup(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	return res
}

// crdChanged keeps the registry in step with stored CRDs.
func (s *Server) crdChanged(ev store.Event) {
	name := ev.Name
	if ev.Type == "DELETED" {
		s.reg.RemoveCRD(name)
		return
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(ev.Object.Object, &crd); err != nil {
		s.log.Error(err, "stored CRD is not valid; not serving it", "crd", name)
		return
	}
	if err := s.reg.AddCRD(&crd); err != nil {
		s.log.Error(err, "register CRD", "crd", name)
		return
	}
	for _, v := range crd.Spec.Versions {
		if res, ok := s.reg.Lookup(schema.GroupVersionResource{Group: crd.Spec.Group, Version: v.Name, Resource: crd.Spec.Names.Plural}); ok && res.Schema != nil {
			res.Schema.WrittenSince(ev.RV) // shared by every version
			break
		}
	}
	storage := s.reg.StorageDir(crd.Spec.Group, crd.Spec.Names.Plural)
	if err := s.store.Register(storage, crd.Spec.Scope == apiextensionsv1.NamespaceScoped); err != nil {
		s.log.Error(err, "load custom resources", "crd", name)
	}
}

// defaultCRD fills the spec defaults and the status kube-apiserver's CRD
// controllers would set (names accepted, established).
func defaultCRD(obj map[string]any) {
	spec, _ := obj["spec"].(map[string]any)
	if spec == nil {
		return
	}
	names, _ := spec["names"].(map[string]any)
	if names == nil {
		return
	}
	if str(names, "singular") == "" {
		names["singular"] = strings.ToLower(str(names, "kind"))
	}
	if str(names, "listKind") == "" && str(names, "kind") != "" {
		names["listKind"] = str(names, "kind") + "List"
	}
	if _, ok := spec["conversion"]; !ok {
		spec["conversion"] = map[string]any{"strategy": "None"}
	}
	var stored []any
	for _, v := range asList(spec["versions"]) {
		m, _ := v.(map[string]any)
		if m != nil && m["storage"] == true {
			stored = append(stored, str(m, "name"))
		}
	}
	now := timestamp(timeNow())
	obj["status"] = map[string]any{
		"acceptedNames": deepCopy(names),
		"conditions": []any{
			map[string]any{"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
			map[string]any{"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
		},
		"storedVersions": stored,
	}
	md := metaOf(obj)
	if !contains(finalizers(md), crdFinalizer) {
		setFinalizers(md, append(finalizers(md), crdFinalizer))
	}
}

func validateCRD(obj map[string]any) error {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, &crd); err != nil {
		return apierrors.NewBadRequest(err.Error())
	}
	gk := schemaGK("apiextensions.k8s.io", "CustomResourceDefinition")
	var errs field.ErrorList
	if want := crd.Spec.Names.Plural + "." + crd.Spec.Group; crd.Name != want {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), crd.Name, "must be spec.names.plural+\".\"+spec.group"))
	}
	storage := 0
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			storage++
		}
	}
	if storage != 1 {
		errs = append(errs, field.Invalid(field.NewPath("spec", "versions"), len(crd.Spec.Versions), "must have exactly one version marked as storage version"))
	}
	if len(errs) > 0 {
		return apierrors.NewInvalid(gk, crd.Name, errs)
	}
	return nil
}

// installCRDFiles creates or updates the CRDs found in YAML or JSON files.
func (s *Server) installCRDFiles(ctx context.Context, files []string) error {
	res := s.crdResource()
	for _, f := range files {
		docs, err := readYAMLDocs(f)
		if err != nil {
			return err
		}
		for _, obj := range docs {
			if str(obj, "kind") != "CustomResourceDefinition" {
				continue
			}
			name := str(metaOf(obj), "name")
			if cur, ok := s.store.Get(crdStorage, "", name); ok {
				if reflect.DeepEqual(cur.Object["spec"], obj["spec"]) {
					continue
				}
				next := deepCopy(cur.Object)
				next["spec"] = obj["spec"]
				if _, err := s.store.Mutate(crdStorage, "", name, func(c map[string]any) (store.Mutation, error) {
					return s.finishUpdate(request{res: res, name: name}, c, prepareUpdate(res, "", c, next))
				}); err != nil {
					return fmt.Errorf("update CRD %s from %s: %w", name, f, err)
				}
				continue
			}
			if _, _, err := s.createObject(request{res: res}, obj, false); err != nil {
				return fmt.Errorf("install CRD %s from %s: %w", name, f, err)
			}
		}
	}
	return nil
}

func readYAMLDocs(path string) ([]map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []map[string]any
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		js, err := yamlToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		obj, err := decodeBody(js)
		if err != nil {
			continue // empty or non-object document
		}
		out = append(out, obj)
	}
}
