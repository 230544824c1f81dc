package apiserver

import (
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// eventColumns are kubectl's columns for core Events (kube-apiserver's
// event printer), so `kubectl get events` shows type, reason, object and
// message; nil for other resources.
func eventColumns(res *registry.Resource) []column {
	if !legacyEvents(res) {
		return nil
	}
	since := func(o map[string]any) any {
		for _, k := range []string{"lastTimestamp", "eventTime", "firstTimestamp"} {
			if t, err := time.Parse(time.RFC3339Nano, str(o, k)); err == nil {
				return duration.HumanDuration(time.Since(t))
			}
		}
		return age(o)
	}
	object := func(o map[string]any) any {
		inv := nestedMap(o, "involvedObject")
		return strings.ToLower(str(inv, "kind")) + "/" + str(inv, "name")
	}
	name := nameCol()
	name.def.Priority = 1
	return []column{
		{def: metav1.TableColumnDefinition{Name: "Last Seen", Type: "string"}, cell: since},
		pathCol("Type", "string", 0, "type"),
		pathCol("Reason", "string", 0, "reason"),
		{def: metav1.TableColumnDefinition{Name: "Object", Type: "string"}, cell: object},
		pathCol("Message", "string", 0, "message"),
		pathCol("Count", "integer", 1, "count"),
		name,
	}
}
