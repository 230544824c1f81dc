package apiserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/util/jsonpath"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
	"github.com/nstance-dev/nstance/internal/devk8s/strategy"
)

// wantsTable reports an Accept header asking for meta.k8s.io Table output.
func wantsTable(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		if strings.Contains(part, "as=Table") && strings.Contains(part, "g=meta.k8s.io") && strings.Contains(part, "v=v1") && !strings.Contains(part, "v=v1beta1") {
			return true
		}
	}
	return false
}

func asList(v any) []any { return object.List(v) }

// crdColumns are Name and a CRD's additionalPrinterColumns.
func crdColumns(cols []apiextensionsv1.CustomResourceColumnDefinition) ([]strategy.Column, error) {
	out := []strategy.Column{strategy.NameColumn()}
	for _, c := range cols {
		jp := jsonpath.New(c.Name).AllowMissingKeys(true)
		if err := jp.Parse(fmt.Sprintf("{%s}", c.JSONPath)); err != nil {
			return nil, fmt.Errorf("printer column %s: %w", c.Name, err)
		}
		typ := c.Type
		out = append(out, strategy.Column{
			Def: metav1.TableColumnDefinition{Name: c.Name, Type: typ, Format: c.Format, Description: c.Description, Priority: c.Priority},
			Cell: func(o map[string]any) any {
				results, err := jp.FindResults(o)
				if err != nil || len(results) == 0 || len(results[0]) == 0 {
					return nil
				}
				v := results[0][0].Interface()
				if typ == "date" {
					if s, ok := v.(string); ok {
						if t, err := time.Parse(time.RFC3339, s); err == nil {
							return duration.HumanDuration(time.Since(t))
						}
					}
				}
				if typ == "string" {
					if _, ok := v.(string); !ok {
						var buf bytes.Buffer
						_ = json.NewEncoder(&buf).Encode(v)
						return strings.TrimSpace(buf.String())
					}
				}
				return v
			},
		})
	}
	return out, nil
}

// table renders entries as a meta.k8s.io/v1 Table.
func (s *Server) table(res *registry.Resource, entries []*store.Entry, cont string, r *http.Request) (*metav1.Table, error) {
	var cols []strategy.Column
	if tc, ok := s.strategy(res).(strategy.TableConvertor); ok {
		cols = tc.Columns()
	} else if len(res.PrinterColumns) > 0 {
		var err error
		if cols, err = crdColumns(res.PrinterColumns); err != nil {
			return nil, err
		}
	} else {
		cols = strategy.DefaultColumns()
	}
	t := &metav1.Table{TypeMeta: metav1.TypeMeta{Kind: "Table", APIVersion: "meta.k8s.io/v1"}}
	t.Continue = cont
	for _, c := range cols {
		t.ColumnDefinitions = append(t.ColumnDefinitions, c.Def)
	}
	includeObject := r.URL.Query().Get("includeObject")
	t.Rows = []metav1.TableRow{}
	for _, e := range entries {
		row := metav1.TableRow{}
		for _, c := range cols {
			row.Cells = append(row.Cells, c.Cell(e.Object))
		}
		switch includeObject {
		case "None":
		case "Object":
			row.Object = runtime.RawExtension{Raw: entryBytes(res, e)}
		default:
			pom := map[string]any{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": e.Object["metadata"]}
			data, err := json.Marshal(pom)
			if err != nil {
				return nil, err
			}
			row.Object = runtime.RawExtension{Raw: data}
		}
		t.Rows = append(t.Rows, row)
	}
	return t, nil
}
