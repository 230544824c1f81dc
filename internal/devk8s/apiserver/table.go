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

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
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

type column struct {
	def  metav1.TableColumnDefinition
	cell func(obj map[string]any) any
}

func age(obj map[string]any) any {
	ts := nestedString(obj, "metadata", "creationTimestamp")
	t, err := time.Parse(time.RFC3339, ts)
	if err != nil {
		return "<unknown>"
	}
	return duration.HumanDuration(time.Since(t))
}

func nameCol() column {
	return column{def: metav1.TableColumnDefinition{Name: "Name", Type: "string", Format: "name", Description: "Name must be unique within a namespace."},
		cell: func(o map[string]any) any { return nestedString(o, "metadata", "name") }}
}

func ageCol() column {
	return column{def: metav1.TableColumnDefinition{Name: "Age", Type: "string", Description: "CreationTimestamp is a timestamp representing the server time when this object was created."}, cell: age}
}

func pathCol(name, typ string, priority int32, path ...string) column {
	return column{def: metav1.TableColumnDefinition{Name: name, Type: typ, Priority: priority}, cell: func(o map[string]any) any {
		v, ok := nested(o, path...)
		if !ok {
			return "<none>"
		}
		return v
	}}
}

// builtinColumns are the columns of built-in kinds beyond Name and Age.
func builtinColumns(res *registry.Resource) []column {
	if !res.BuiltIn {
		return nil
	}
	switch res.Resource {
	case "namespaces":
		return []column{pathCol("Status", "string", 0, "status", "phase")}
	case "nodes":
		return []column{
			{def: metav1.TableColumnDefinition{Name: "Status", Type: "string"}, cell: nodeStatus},
			{def: metav1.TableColumnDefinition{Name: "Roles", Type: "string"}, cell: func(o map[string]any) any { return "<none>" }},
			pathCol("Version", "string", 0, "status", "nodeInfo", "kubeletVersion"),
		}
	case "pods":
		return []column{
			{def: metav1.TableColumnDefinition{Name: "Ready", Type: "string"}, cell: podReady},
			{def: metav1.TableColumnDefinition{Name: "Status", Type: "string"}, cell: podStatus},
			pathCol("Restarts", "string", 0, "status", "restartCount"),
			pathCol("Node", "string", 1, "spec", "nodeName"),
		}
	case "configmaps":
		return []column{dataCol()}
	case "secrets":
		return []column{pathCol("Type", "string", 0, "type"), dataCol()}
	case "poddisruptionbudgets":
		return []column{
			pathCol("Min Available", "string", 0, "spec", "minAvailable"),
			pathCol("Max Unavailable", "string", 0, "spec", "maxUnavailable"),
			pathCol("Allowed Disruptions", "integer", 0, "status", "disruptionsAllowed"),
		}
	case "leases":
		return []column{pathCol("Holder", "string", 0, "spec", "holderIdentity")}
	case "deployments", "replicasets", "statefulsets", "daemonsets":
		return appsColumns(res.Resource)
	case "customresourcedefinitions":
		return []column{{def: metav1.TableColumnDefinition{Name: "Created At", Type: "date"}, cell: func(o map[string]any) any { return nestedString(o, "metadata", "creationTimestamp") }}}
	}
	return nil
}

func dataCol() column {
	return column{def: metav1.TableColumnDefinition{Name: "Data", Type: "string"}, cell: func(o map[string]any) any {
		d, _ := o["data"].(map[string]any)
		b, _ := o["binaryData"].(map[string]any)
		return int64(len(d) + len(b))
	}}
}

func nodeStatus(o map[string]any) any {
	status := "Unknown"
	conds, _ := nested(o, "status", "conditions")
	list, _ := conds.([]any)
	for _, c := range list {
		m, _ := c.(map[string]any)
		if str(m, "type") == "Ready" {
			if str(m, "status") == "True" {
				status = "Ready"
			} else {
				status = "NotReady"
			}
		}
	}
	if u, _ := nested(o, "spec", "unschedulable"); u == true {
		status += ",SchedulingDisabled"
	}
	return status
}

func podReady(o map[string]any) any {
	cs, _ := nested(o, "spec", "containers")
	total := len(asList(cs))
	ready := 0
	st, _ := nested(o, "status", "containerStatuses")
	for _, c := range asList(st) {
		if m, _ := c.(map[string]any); m != nil && m["ready"] == true {
			ready++
		}
	}
	return fmt.Sprintf("%d/%d", ready, total)
}

func podStatus(o map[string]any) any {
	if hasDeletionTimestamp(o) {
		return "Terminating"
	}
	if p := nestedString(o, "status", "phase"); p != "" {
		return p
	}
	return "Pending"
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func crdColumns(cols []apiextensionsv1.CustomResourceColumnDefinition) ([]column, error) {
	var out []column
	for _, c := range cols {
		jp := jsonpath.New(c.Name).AllowMissingKeys(true)
		if err := jp.Parse(fmt.Sprintf("{%s}", c.JSONPath)); err != nil {
			return nil, fmt.Errorf("printer column %s: %w", c.Name, err)
		}
		typ := c.Type
		out = append(out, column{
			def: metav1.TableColumnDefinition{Name: c.Name, Type: typ, Format: c.Format, Description: c.Description, Priority: c.Priority},
			cell: func(o map[string]any) any {
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
	cols := []column{nameCol()}
	if ev := eventColumns(res); ev != nil {
		cols = ev
	} else if len(res.PrinterColumns) > 0 {
		extra, err := crdColumns(res.PrinterColumns)
		if err != nil {
			return nil, err
		}
		cols = append(cols, extra...)
	} else {
		cols = withAge(res, append(cols, builtinColumns(res)...))
	}
	t := &metav1.Table{TypeMeta: metav1.TypeMeta{Kind: "Table", APIVersion: "meta.k8s.io/v1"}}
	t.Continue = cont
	for _, c := range cols {
		t.ColumnDefinitions = append(t.ColumnDefinitions, c.def)
	}
	includeObject := r.URL.Query().Get("includeObject")
	t.Rows = []metav1.TableRow{}
	for _, e := range entries {
		row := metav1.TableRow{}
		for _, c := range cols {
			row.Cells = append(row.Cells, c.cell(e.Object))
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
