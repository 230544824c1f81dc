package nodeauthz

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/authentication/user"
)

// kubeletLabel reports whether a kubelet may set a label on its own Node:
// the labels and label namespaces kubelets set (k8s.io/kubelet's list).
func kubeletLabel(key string) bool {
	switch key {
	case corev1.LabelHostname, corev1.LabelTopologyZone, corev1.LabelTopologyRegion,
		corev1.LabelFailureDomainBetaZone, corev1.LabelFailureDomainBetaRegion,
		corev1.LabelInstanceType, corev1.LabelInstanceTypeStable, corev1.LabelOSStable, corev1.LabelArchStable,
		"beta.kubernetes.io/os", "beta.kubernetes.io/arch":
		return true
	}
	ns := labelNamespace(key)
	for _, allowed := range []string{corev1.LabelNamespaceSuffixKubelet, corev1.LabelNamespaceSuffixNode} {
		if ns == allowed || strings.HasSuffix(ns, "."+allowed) {
			return true
		}
	}
	return false
}

func labelNamespace(key string) string {
	ns, _, ok := strings.Cut(key, "/")
	if !ok {
		return ""
	}
	return ns
}

// forbiddenLabels are the changed label keys a kubelet may not set:
// node-restriction.kubernetes.io ones, and kubernetes.io or k8s.io ones
// that are not kubelet labels.
func forbiddenLabels(next, prev map[string]any) []string {
	var out []string
	check := func(k string) {
		ns := labelNamespace(k)
		restricted := ns == corev1.LabelNamespaceNodeRestriction || strings.HasSuffix(ns, "."+corev1.LabelNamespaceNodeRestriction)
		kube := ns == "kubernetes.io" || strings.HasSuffix(ns, ".kubernetes.io") || ns == "k8s.io" || strings.HasSuffix(ns, ".k8s.io")
		if (restricted || (kube && !kubeletLabel(k))) && !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	for k, v := range next {
		if pv, ok := prev[k]; !ok || pv != v {
			check(k)
		}
	}
	for k, v := range prev {
		if nv, ok := next[k]; !ok || nv != v {
			check(k)
		}
	}
	sort.Strings(out)
	return out
}

// AdmitUpdate runs NodeRestriction's checks of an update by a kubelet: of
// the resources it restricts, only a Node's own updates are checked here
// (AdmitNodeWrite).
func AdmitUpdate(u user.Info, a Attributes, cur, next map[string]any) error {
	if (schema.GroupResource{Group: a.APIGroup, Resource: a.Resource}) != (schema.GroupResource{Resource: "nodes"}) {
		return nil
	}
	return AdmitNodeWrite(u, cur, next)
}

// AdmitNodeWrite checks what a kubelet writes to its own Node as
// NodeRestriction does: on create (prev nil) no configSource and only
// kubelet labels; on update no new configSource, no change of taints or
// ownerReferences, and no change of labels other than kubelet labels. It
// returns a 403 error, or nil; other users' writes are not checked.
func AdmitNodeWrite(u user.Info, prev, next map[string]any) error {
	node := NodeName(u)
	meta, _ := next["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	spec, _ := next["spec"].(map[string]any)
	labels, _ := meta["labels"].(map[string]any)
	forbid := func(msg string) error {
		return apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, name, errors.New(msg))
	}
	if prev == nil {
		if spec["configSource"] != nil {
			return forbid(fmt.Sprintf("node %q is not allowed to create pods with a non-nil configSource", node))
		}
		if bad := forbiddenLabels(labels, nil); len(bad) > 0 {
			return forbid(fmt.Sprintf("node %q is not allowed to set the following labels: %s", node, strings.Join(bad, ", ")))
		}
		return nil
	}
	pmeta, _ := prev["metadata"].(map[string]any)
	pspec, _ := prev["spec"].(map[string]any)
	plabels, _ := pmeta["labels"].(map[string]any)
	if spec["configSource"] != nil && !reflect.DeepEqual(spec["configSource"], pspec["configSource"]) {
		return forbid(fmt.Sprintf("node %q is not allowed to update configSource to a new non-nil configSource", node))
	}
	if !sameList(spec["taints"], pspec["taints"]) {
		return forbid(fmt.Sprintf("node %q is not allowed to modify taints", node))
	}
	if !sameList(meta["ownerReferences"], pmeta["ownerReferences"]) {
		return forbid(fmt.Sprintf("node %q is not allowed to modify ownerReferences", node))
	}
	if bad := forbiddenLabels(labels, plabels); len(bad) > 0 {
		return forbid("is not allowed to modify labels: " + strings.Join(bad, ", "))
	}
	return nil
}

// sameList compares two JSON lists, a missing list equal to an empty one.
func sameList(a, b any) bool {
	la, _ := a.([]any)
	lb, _ := b.([]any)
	if len(la) == 0 && len(lb) == 0 {
		return true
	}
	return reflect.DeepEqual(la, lb)
}
