package apiserver

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/strategy"
)

// selector is a parsed label and field selector pair.
type selector struct {
	res    *registry.Resource
	labels labels.Selector
	fields fields.Selector
	// kindFields are the resource's field selector keys beyond
	// metadata.name and metadata.namespace.
	kindFields []strategy.Field
}

// kindFields lists the field selectors a resource supports beyond
// metadata.name and metadata.namespace.
func (s *Server) kindFields(res *registry.Resource) []strategy.Field {
	if fs, ok := s.strategy(res).(strategy.FieldSelectable); ok {
		return fs.Fields()
	}
	return nil
}

func (s *Server) parseSelectors(res *registry.Resource, label, field string) (*selector, error) {
	sel := &selector{res: res, labels: labels.Everything(), fields: fields.Everything(), kindFields: s.kindFields(res)}
	if label != "" {
		ls, err := labels.Parse(label)
		if err != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("unable to parse requirement: %v", strings.TrimPrefix(err.Error(), "unable to parse requirement: ")))
		}
		sel.labels = ls
	}
	if field != "" {
		fs, err := fields.ParseSelector(field)
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		allowed := map[string]bool{"metadata.name": true, "metadata.namespace": true}
		for _, f := range sel.kindFields {
			allowed[f.Name] = true
		}
		for _, req := range fs.Requirements() {
			if allowed[req.Field] {
				continue
			}
			if !res.BuiltIn {
				return nil, apierrors.NewBadRequest(fmt.Sprintf("field label not supported: %s", req.Field))
			}
			known := []string{`"metadata.name"`, `"metadata.namespace"`}
			for _, f := range sel.kindFields {
				known = append(known, strconv.Quote(f.Name))
			}
			return nil, apierrors.NewBadRequest(fmt.Sprintf("%q is not a known field selector: only %s", req.Field, strings.Join(known, ", ")))
		}
		sel.fields = fs
	}
	return sel, nil
}

func (sel *selector) empty() bool {
	return sel.labels.Empty() && sel.fields.Empty()
}

func (sel *selector) matches(obj map[string]any) bool {
	if obj == nil {
		return false
	}
	md, _ := obj["metadata"].(map[string]any)
	if !sel.labels.Empty() && !sel.labels.Matches(labels.Set(stringMap(md["labels"]))) {
		return false
	}
	if sel.fields.Empty() {
		return true
	}
	set := fields.Set{"metadata.name": str(md, "name")}
	if sel.res.Namespaced {
		set["metadata.namespace"] = str(md, "namespace")
	}
	for _, f := range sel.kindFields {
		set[f.Name] = f.Value(obj)
	}
	return sel.fields.Matches(set)
}

type continueToken struct {
	V     string `json:"v"`
	RV    uint64 `json:"rv"`
	Start string `json:"start"`
}

func encodeContinue(rv uint64, start string) string {
	data, _ := json.Marshal(continueToken{V: "meta.k8s.io/v1", RV: rv, Start: start})
	return base64.RawURLEncoding.EncodeToString(data)
}

func decodeContinue(tok string) (continueToken, error) {
	var t continueToken
	data, err := base64.RawURLEncoding.DecodeString(tok)
	if err == nil {
		err = json.Unmarshal(data, &t)
	}
	if err != nil || t.V != "meta.k8s.io/v1" || t.Start == "" {
		return t, apierrors.NewBadRequest("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
	}
	return t, nil
}

// pagination parses limit and continue into a page size and a start key.
func pagination(limitParam, cont string) (int64, string, error) {
	var limit int64
	if limitParam != "" {
		n, err := strconv.ParseInt(limitParam, 10, 64)
		if err != nil {
			return 0, "", apierrors.NewBadRequest(fmt.Sprintf("invalid limit %q", limitParam))
		}
		if n > 0 {
			limit = n
		}
	}
	if cont == "" {
		return limit, "", nil
	}
	t, err := decodeContinue(cont)
	if err != nil {
		return 0, "", err
	}
	return limit, t.Start, nil
}
