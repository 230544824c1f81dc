package registry

// builtins is the table of Kubernetes kinds dev-k8s serves without a CRD.
func builtins() []Resource {
	return []Resource{
		{Version: "v1", Resource: "namespaces", Kind: "Namespace", ShortNames: []string{"ns"}, Status: true, BuiltIn: true, ReturnDeleted: true, Storage: true},
		{Version: "v1", Resource: "nodes", Kind: "Node", ShortNames: []string{"no"}, Status: true, BuiltIn: true, Storage: true},
		{Version: "v1", Resource: "pods", Kind: "Pod", Namespaced: true, ShortNames: []string{"po"}, Categories: []string{"all"}, Status: true, Subresources: []string{"eviction"}, Generation: true, BuiltIn: true, ReturnDeleted: true, Storage: true},
		{Version: "v1", Resource: "secrets", Kind: "Secret", Namespaced: true, BuiltIn: true, Storage: true},
		{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true, ShortNames: []string{"cm"}, BuiltIn: true, Storage: true},
		{Version: "v1", Resource: "serviceaccounts", Kind: "ServiceAccount", Namespaced: true, ShortNames: []string{"sa"}, Subresources: []string{"token"}, BuiltIn: true, ReturnDeleted: true, Storage: true},
		{Version: "v1", Resource: "events", Kind: "Event", Namespaced: true, ShortNames: []string{"ev"}, BuiltIn: true, CreateOnUpdate: true, Storage: true},
		{Version: "v1", Resource: "services", Kind: "Service", Namespaced: true, ShortNames: []string{"svc"}, Categories: []string{"all"}, Status: true, BuiltIn: true, Storage: true},
		{Group: "storage.k8s.io", Version: "v1", Resource: "csinodes", Kind: "CSINode", BuiltIn: true, Storage: true},
		{Group: "storage.k8s.io", Version: "v1", Resource: "csidrivers", Kind: "CSIDriver", BuiltIn: true, Storage: true},
		{Group: "node.k8s.io", Version: "v1", Resource: "runtimeclasses", Kind: "RuntimeClass", BuiltIn: true, Storage: true},
		{Group: "coordination.k8s.io", Version: "v1", Resource: "leases", Kind: "Lease", Namespaced: true, BuiltIn: true, CreateOnUpdate: true, Storage: true},
		{Group: "policy", Version: "v1", Resource: "poddisruptionbudgets", Kind: "PodDisruptionBudget", Namespaced: true, ShortNames: []string{"pdb"}, Status: true, Generation: true, BuiltIn: true, Storage: true},
		{Group: "apps", Version: "v1", Resource: "deployments", Kind: "Deployment", Namespaced: true, ShortNames: []string{"deploy"}, Categories: []string{"all"}, Status: true, Generation: true, BuiltIn: true, Storage: true},
		{Group: "apps", Version: "v1", Resource: "replicasets", Kind: "ReplicaSet", Namespaced: true, ShortNames: []string{"rs"}, Categories: []string{"all"}, Status: true, Generation: true, BuiltIn: true, Storage: true},
		{Group: "apps", Version: "v1", Resource: "statefulsets", Kind: "StatefulSet", Namespaced: true, ShortNames: []string{"sts"}, Categories: []string{"all"}, Status: true, Generation: true, BuiltIn: true, Storage: true},
		{Group: "apps", Version: "v1", Resource: "daemonsets", Kind: "DaemonSet", Namespaced: true, ShortNames: []string{"ds"}, Categories: []string{"all"}, Status: true, Generation: true, BuiltIn: true, Storage: true},
		{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions", Kind: "CustomResourceDefinition", ShortNames: []string{"crd", "crds"}, Categories: []string{"api-extensions"}, Status: true, Generation: true, BuiltIn: true, ReturnDeleted: true, Storage: true},
	}
}
