package strategy

import (
	"strings"
	"time"

	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// Events are core v1 Events, which keep their legacy leniency about names.
type Events struct{ Generic }

// Resource is the registry entry.
func (Events) Resource() registry.Resource {
	return registry.Resource{Version: "v1", Resource: "events", Kind: "Event", Namespaced: true, ShortNames: []string{"ev"}, BuiltIn: true, CreateOnUpdate: true, Storage: true}
}

// NameRule: none beyond path segments.
func (Events) NameRule() apimachineryvalidation.ValidateNameFunc { return nil }

// Fields are the Event field selectors.
func (Events) Fields() []Field {
	fs := pathFields("involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion",
		"involvedObject.resourceVersion", "involvedObject.fieldPath", "reason", "reportingComponent")
	fs = append(fs, Field{Name: "source", Value: func(obj map[string]any) string { return object.NestedString(obj, "source", "component") }})
	return append(fs, pathField("type"))
}

// Columns are kubectl's columns for core Events (kube-apiserver's event
// printer), so `kubectl get events` shows type, reason, object and message.
func (Events) Columns() []Column {
	since := func(o map[string]any) any {
		for _, k := range []string{"lastTimestamp", "eventTime", "firstTimestamp"} {
			if t, err := time.Parse(time.RFC3339Nano, object.Str(o, k)); err == nil {
				return duration.HumanDuration(time.Since(t))
			}
		}
		return Age(o)
	}
	involved := func(o map[string]any) any {
		inv := object.NestedMap(o, "involvedObject")
		return strings.ToLower(object.Str(inv, "kind")) + "/" + object.Str(inv, "name")
	}
	name := NameColumn()
	name.Def.Priority = 1
	return []Column{
		{Def: metav1.TableColumnDefinition{Name: "Last Seen", Type: "string"}, Cell: since},
		pathCol("Type", "string", 0, "type"),
		pathCol("Reason", "string", 0, "reason"),
		{Def: metav1.TableColumnDefinition{Name: "Object", Type: "string"}, Cell: involved},
		pathCol("Message", "string", 0, "message"),
		pathCol("Count", "integer", 1, "count"),
		name,
	}
}
