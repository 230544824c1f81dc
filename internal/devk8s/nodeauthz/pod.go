package nodeauthz

// PodUses reports whether a pod (as stored JSON) references the object of
// kind (KindSecret, KindConfigMap, KindServiceAccount) named name: through
// volumes (projected sources included), environment variables, envFrom and
// imagePullSecrets of any container, or as its ServiceAccount.
func PodUses(pod map[string]any, kind, name string) bool {
	spec, _ := pod["spec"].(map[string]any)
	if spec == nil || name == "" {
		return false
	}
	switch kind {
	case KindServiceAccount:
		sa, _ := spec["serviceAccountName"].(string)
		if sa == "" {
			sa = "default"
		}
		return sa == name
	case KindSecret:
		for _, ref := range items(spec["imagePullSecrets"]) {
			if str(ref, "name") == name {
				return true
			}
		}
	case KindConfigMap:
	default:
		return false
	}
	for _, v := range items(spec["volumes"]) {
		if volumeUses(v, kind, name) {
			return true
		}
		projected, _ := v["projected"].(map[string]any)
		for _, src := range items(projected["sources"]) {
			if volumeUses(src, kind, name) {
				return true
			}
		}
	}
	for _, field := range []string{"initContainers", "containers", "ephemeralContainers"} {
		for _, c := range items(spec[field]) {
			if containerUses(c, kind, name) {
				return true
			}
		}
	}
	return false
}

// volumeUses checks a volume or projected source.
func volumeUses(v map[string]any, kind, name string) bool {
	if kind == KindSecret {
		secret, _ := v["secret"].(map[string]any)
		return str(secret, "secretName") == name || str(secret, "name") == name
	}
	cm, _ := v["configMap"].(map[string]any)
	return str(cm, "name") == name
}

func containerUses(c map[string]any, kind, name string) bool {
	ref, keyRef := "configMapRef", "configMapKeyRef"
	if kind == KindSecret {
		ref, keyRef = "secretRef", "secretKeyRef"
	}
	for _, e := range items(c["envFrom"]) {
		r, _ := e[ref].(map[string]any)
		if str(r, "name") == name {
			return true
		}
	}
	for _, e := range items(c["env"]) {
		from, _ := e["valueFrom"].(map[string]any)
		r, _ := from[keyRef].(map[string]any)
		if str(r, "name") == name {
			return true
		}
	}
	return false
}

func items(v any) []map[string]any {
	list, _ := v.([]any)
	out := make([]map[string]any, 0, len(list))
	for _, x := range list {
		if m, ok := x.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

func str(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}
