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

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
)

// crdStorage is the directory of stored CRDs.
const crdStorage = "customresourcedefinitions"

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
					return s.finishUpdate(request{res: res, name: name}, c, s.prepareUpdate(res, "", c, next))
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
