package strategy

import (
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestBuiltinsAreConsistent(t *testing.T) {
	seen := map[schema.GroupResource]bool{}
	for _, b := range Builtins() {
		res := b.Resource()
		gr := res.GroupResource()
		require.False(t, seen[gr], "%s declared twice", gr)
		seen[gr] = true
		require.True(t, res.BuiltIn, "%s", gr)
		require.True(t, res.Storage, "%s", gr)
		require.NotEmpty(t, res.Kind, "%s", gr)
		require.NotEmpty(t, res.Version, "%s", gr)
	}
	require.Len(t, Resources(), len(Builtins()))
	require.Equal(t, "", Resources()[0].Group, "the core group comes first in discovery")
}

func TestCapabilities(t *testing.T) {
	var st Strategy = Pods{}
	_, graceful := st.(GracefulDeleter)
	require.True(t, graceful, "pods are deleted gracefully")
	_, graceful = Strategy(Secrets{}).(GracefulDeleter)
	require.False(t, graceful)
	n, ok := Strategy(Events{}).(Namer)
	require.True(t, ok)
	require.Nil(t, n.NameRule(), "core Events have no name rule of their own")
	_, ok = Strategy(Generic{}).(TableConvertor)
	require.False(t, ok, "the generic strategy has Name and Age only")
	var controllers []string
	for _, b := range Builtins() {
		if _, ok := b.(Controller); ok {
			controllers = append(controllers, b.Resource().Resource)
		}
	}
	require.Equal(t, []string{"namespaces", "pods", "poddisruptionbudgets", "daemonsets"}, controllers, "controllers run in this order")
}

func TestFields(t *testing.T) {
	values := func(fs []Field, obj map[string]any) map[string]string {
		out := map[string]string{}
		for _, f := range fs {
			out[f.Name] = f.Value(obj)
		}
		return out
	}
	pod := values(Pods{}.Fields(), map[string]any{"spec": map[string]any{"nodeName": "n1"}, "status": map[string]any{"phase": "Running"}})
	require.Equal(t, "n1", pod["spec.nodeName"])
	require.Equal(t, "false", pod["spec.hostNetwork"], "a boolean field is false when absent")
	require.Equal(t, "Running", pod["status.phase"])
	require.Equal(t, "", pod["status.podIP"])
	ev := values(Events{}.Fields(), map[string]any{"source": map[string]any{"component": "kubelet"}, "type": "Warning"})
	require.Equal(t, "kubelet", ev["source"], "source selects on source.component")
	require.Equal(t, "Warning", ev["type"])
}

func TestColumns(t *testing.T) {
	names := func(cols []Column) []string {
		var out []string
		for _, c := range cols {
			out = append(out, c.Def.Name)
		}
		return out
	}
	require.Equal(t, []string{"Name", "Status", "Age"}, names(Namespaces{}.Columns()))
	require.Equal(t, []string{"Name", "Ready", "Age", "Containers", "Images"}, names(StatefulSets{}.Columns()),
		"apps kinds show Age before the wide columns")
	require.Equal(t, "Last Seen", Events{}.Columns()[0].Def.Name, "Events have kubectl's event columns")
}

func TestPodGracePeriod(t *testing.T) {
	bound := map[string]any{"spec": map[string]any{"nodeName": "n1", "terminationGracePeriodSeconds": int64(10)}}
	g, ok := Pods{}.GracePeriod(bound, metav1.DeleteOptions{})
	require.True(t, ok)
	require.Equal(t, int64(10), g)
	zero := int64(0)
	_, ok = Pods{}.GracePeriod(bound, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	require.False(t, ok, "gracePeriodSeconds=0 deletes at once")
	_, ok = Pods{}.GracePeriod(map[string]any{"spec": map[string]any{}}, metav1.DeleteOptions{})
	require.False(t, ok, "an unbound pod has no kubelet to wait for")
}

func TestNamespaceDeletion(t *testing.T) {
	ns := map[string]any{"metadata": map[string]any{"name": "a"}}
	Namespaces{}.PrepareForCreate(nil, ns)
	require.True(t, Namespaces{}.SpecFinalizers(ns))
	Namespaces{}.PrepareForDelete(ns)
	require.Equal(t, "Terminating", ns["status"].(map[string]any)["phase"])
}

func TestImmutableData(t *testing.T) {
	res := ConfigMaps{}.Resource()
	old := map[string]any{"metadata": map[string]any{"name": "c"}, "immutable": true, "data": map[string]any{"a": "1"}}
	same := map[string]any{"metadata": map[string]any{"name": "c"}, "immutable": true, "data": map[string]any{"a": "1"}}
	changed := map[string]any{"metadata": map[string]any{"name": "c"}, "immutable": true, "data": map[string]any{"a": "2"}}
	require.NoError(t, ConfigMaps{}.Validate(&res, old, same))
	require.Error(t, ConfigMaps{}.Validate(&res, old, changed))
	require.NoError(t, ConfigMaps{}.Validate(&res, nil, changed), "a create has nothing to keep")
}

func TestDaemonSetTemplateGeneration(t *testing.T) {
	res := DaemonSets{}.Resource()
	tmpl := func(image string) map[string]any {
		return map[string]any{"metadata": map[string]any{"name": "d"}, "spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"containers": []any{map[string]any{"name": "c", "image": image}}}}}}
	}
	gen := func(obj map[string]any) string {
		return obj["metadata"].(map[string]any)["annotations"].(map[string]any)["deprecated.daemonset.template.generation"].(string)
	}
	cur := tmpl("a:1")
	DaemonSets{}.PrepareForCreate(&res, cur)
	require.Equal(t, "1", gen(cur))
	DaemonSets{}.NormalizeFile(&res, nil, cur)
	same := tmpl("a:1")
	DaemonSets{}.PrepareForUpdate(&res, cur, same)
	require.Equal(t, "1", gen(same), "an unchanged template keeps its generation")
	next := tmpl("a:2")
	DaemonSets{}.PrepareForUpdate(&res, cur, next)
	require.Equal(t, "2", gen(next), "a new template bumps it")
}
