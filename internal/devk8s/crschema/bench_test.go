package crschema

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

func machineObj() map[string]any {
	return map[string]any{
		"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "NstanceMachine",
		"metadata": map[string]any{"name": "m", "namespace": "default", "uid": "u", "creationTimestamp": "2026-01-01T00:00:00Z",
			"labels": map[string]any{"cluster.x-k8s.io/cluster-name": "dev"}},
		"spec": map[string]any{"group": "workers", "shard": "dev-1", "instanceType": "t3.small", "vars": map[string]any{"a": "1"}},
	}
}

func BenchmarkDecode(b *testing.B) {
	static, _ := NewStatic()
	k, err := New(projectCRD(&testing.T{}, "infrastructure.cluster.x-k8s.io_nstancemachines.yaml"), static)
	if err != nil {
		b.Fatal(err)
	}
	v := k.Version("v1beta1")
	base := machineObj()
	for b.Loop() {
		obj := runtime.DeepCopyJSON(base)
		if _, err := v.Decode(obj, false); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBeforeCreate(b *testing.B) {
	static, _ := NewStatic()
	k, _ := New(projectCRD(&testing.T{}, "infrastructure.cluster.x-k8s.io_nstancemachines.yaml"), static)
	v := k.Version("v1beta1")
	base := machineObj()
	for b.Loop() {
		obj := runtime.DeepCopyJSON(base)
		if errs := v.BeforeCreate(context.Background(), obj); len(errs) > 0 {
			b.Fatal(errs)
		}
	}
}

func BenchmarkToTyped(b *testing.B) {
	static, _ := NewStatic()
	k, _ := New(projectCRD(&testing.T{}, "infrastructure.cluster.x-k8s.io_nstancemachines.yaml"), static)
	tc := k.types
	base := machineObj()
	for b.Loop() {
		if _, err := tc.ObjectToTyped(&unstructured.Unstructured{Object: base}); err != nil {
			b.Fatal(err)
		}
	}
}
