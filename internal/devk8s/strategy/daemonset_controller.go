package strategy

import (
	"encoding/json"
	"github.com/go-logr/logr"
	"hash/fnv"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
	"github.com/nstance-dev/nstance/internal/devk8s/store"
)

// A minimal DaemonSet controller, standing in for kube-controller-manager's
// (with the scheduler's binding): one pod per Node that should run it, as
// the real controller decides (the template's nodeSelector and required
// node affinity, and the NoSchedule/NoExecute taints the template plus the
// controller's own tolerations tolerate), owned by the DaemonSet
// (controller: true), pinned to its Node by the node affinity the real
// controller writes and bound (spec.nodeName) as the scheduler would. Pods
// on Nodes that no longer qualify, or that are gone, are deleted; a
// RollingUpdate replaces pods of an older template generation (unavailable
// ones at once, available ones maxUnavailable at a time). Status counts follow the real controller's definitions. Pods of
// a deleted DaemonSet go through the ownerReference garbage collector
// (which honours propagationPolicy Orphan). Not done: ControllerRevisions,
// adopting matching pods without an owner, surge updates, Events.

// Labels the real controller puts on its pods.
const (
	dsTemplateGenerationLabel = "pod-template-generation"
	dsRevisionHashLabel       = appsv1.DefaultDaemonSetUniqueLabelKey
)

// dsTolerations are the tolerations the real controller adds to every
// DaemonSet pod (AddOrUpdateDaemonPodTolerations).
func dsTolerations(hostNetwork bool) []corev1.Toleration {
	ts := []corev1.Toleration{
		{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
		{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
		{Key: corev1.TaintNodeDiskPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeMemoryPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodePIDPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	}
	if hostNetwork {
		ts = append(ts, corev1.Toleration{Key: corev1.TaintNodeNetworkUnavailable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	}
	return ts
}

// withTolerations adds the controller's tolerations the template lacks.
func withTolerations(spec *corev1.PodSpec) []corev1.Toleration {
	out := append([]corev1.Toleration(nil), spec.Tolerations...)
	for _, t := range dsTolerations(spec.HostNetwork) {
		found := false
		for i := range out {
			if out[i].MatchToleration(&t) {
				found = true
			}
		}
		if !found {
			out = append(out, t)
		}
	}
	return out
}

// nodeShouldRun reports whether a DaemonSet's pod belongs on a Node.
func nodeShouldRun(log logr.Logger, spec *corev1.PodSpec, tolerations []corev1.Toleration, node *corev1.Node) bool {
	if len(spec.NodeSelector) > 0 && !labels.SelectorFromSet(spec.NodeSelector).Matches(labels.Set(node.Labels)) {
		return false
	}
	if a := spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		if !nodeSelectorMatches(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution, node) {
			return false
		}
	}
	for i := range node.Spec.Taints {
		taint := &node.Spec.Taints[i]
		if taint.Effect != corev1.TaintEffectNoSchedule && taint.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		tolerated := false
		for j := range tolerations {
			if tolerations[j].ToleratesTaint(log, taint, false) {
				tolerated = true
				break
			}
		}
		if !tolerated {
			return false
		}
	}
	return true
}

// nodeSelectorMatches evaluates required node affinity: any term matches
// when all its label expressions and field expressions (metadata.name) do.
func nodeSelectorMatches(ns *corev1.NodeSelector, node *corev1.Node) bool {
	for _, term := range ns.NodeSelectorTerms {
		if len(term.MatchExpressions) == 0 && len(term.MatchFields) == 0 {
			continue
		}
		if requirementsMatch(term.MatchExpressions, labels.Set(node.Labels)) &&
			requirementsMatch(term.MatchFields, labels.Set{"metadata.name": node.Name}) {
			return true
		}
	}
	return false
}

func requirementsMatch(reqs []corev1.NodeSelectorRequirement, set labels.Set) bool {
	ops := map[corev1.NodeSelectorOperator]selection.Operator{
		corev1.NodeSelectorOpIn: selection.In, corev1.NodeSelectorOpNotIn: selection.NotIn,
		corev1.NodeSelectorOpExists: selection.Exists, corev1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
		corev1.NodeSelectorOpGt: selection.GreaterThan, corev1.NodeSelectorOpLt: selection.LessThan,
	}
	for _, r := range reqs {
		op, ok := ops[r.Operator]
		if !ok {
			return false
		}
		req, err := labels.NewRequirement(r.Key, op, r.Values)
		if err != nil || !req.Matches(set) {
			return false
		}
	}
	return true
}

// templateHash stands in for the ControllerRevision hash label.
func templateHash(t *corev1.PodTemplateSpec) string {
	data, _ := json.Marshal(t)
	h := fnv.New32a()
	_, _ = h.Write(data)
	return rand.SafeEncodeString(strconv.FormatUint(uint64(h.Sum32()), 10))
}

func templateGeneration(ds *appsv1.DaemonSet) string {
	if g := ds.Annotations[appsv1.DeprecatedTemplateGeneration]; g != "" {
		return g
	}
	return "1"
}

// daemonPod builds the pod the controller creates for a Node.
func daemonPod(ds *appsv1.DaemonSet, node string) (map[string]any, error) {
	tmpl := ds.Spec.Template.DeepCopy()
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			GenerateName:    ds.Name + "-",
			Namespace:       ds.Namespace,
			Labels:          map[string]string{},
			Annotations:     tmpl.Annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))},
		},
		Spec: tmpl.Spec,
	}
	for k, v := range tmpl.Labels {
		pod.Labels[k] = v
	}
	pod.Labels[dsTemplateGenerationLabel] = templateGeneration(ds)
	pod.Labels[dsRevisionHashLabel] = templateHash(&ds.Spec.Template)
	pod.Spec.Tolerations = withTolerations(&tmpl.Spec)
	// The node affinity the real controller writes, replacing any required
	// node affinity of the template, and the binding the scheduler makes.
	if pod.Spec.Affinity == nil {
		pod.Spec.Affinity = &corev1.Affinity{}
	}
	if pod.Spec.Affinity.NodeAffinity == nil {
		pod.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}},
		}}},
	}
	pod.Spec.NodeName = node
	return runtime.DefaultUnstructuredConverter.ToUnstructured(pod)
}

// isControlledBy reports whether a pod's controller reference names ds.
func isControlledBy(pod *corev1.Pod, ds *appsv1.DaemonSet) bool {
	ref := metav1.GetControllerOf(pod)
	return ref != nil && ref.UID == ds.UID && ref.Kind == "DaemonSet"
}

// Sync runs the DaemonSet controller over every DaemonSet.
func (DaemonSets) Sync(c Cluster, dsRes *registry.Resource) {
	podRes, ok := c.Lookup(schema.GroupVersionResource{Version: "v1", Resource: "pods"})
	if !ok {
		return
	}
	nodeRes, ok := c.Lookup(schema.GroupVersionResource{Version: "v1", Resource: "nodes"})
	if !ok {
		return
	}
	entries := c.List(dsRes, "")
	if len(entries) == 0 {
		return
	}
	nodeEntries := c.List(nodeRes, "")
	nodes := make([]*corev1.Node, 0, len(nodeEntries))
	for _, e := range nodeEntries {
		var n corev1.Node
		if err := object.ToTyped(e.Object, &n); err == nil {
			nodes = append(nodes, &n)
		}
	}
	for _, e := range entries {
		var ds appsv1.DaemonSet
		if err := object.ToTyped(e.Object, &ds); err != nil || ds.DeletionTimestamp != nil {
			continue
		}
		syncDaemonSet(c, dsRes, podRes, &ds, nodes)
	}
}

func syncDaemonSet(c Cluster, dsRes, podRes *registry.Resource, ds *appsv1.DaemonSet, nodes []*corev1.Node) {
	podEntries := c.List(podRes, ds.Namespace)
	byNode := map[string][]*corev1.Pod{}
	for _, pe := range podEntries {
		var p corev1.Pod
		if err := object.ToTyped(pe.Object, &p); err == nil && isControlledBy(&p, ds) {
			byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], &p)
		}
	}
	tolerations := withTolerations(&ds.Spec.Template.Spec)
	gen := templateGeneration(ds)
	var st appsv1.DaemonSetStatus
	var outdated []*corev1.Pod
	unavailable := 0
	seen := map[string]bool{}
	deletePod := func(p *corev1.Pod) {
		if p.DeletionTimestamp == nil {
			err := c.Delete(podRes, p.Namespace, p.Name, metav1.DeleteOptions{})
			c.LogErr(err, "delete DaemonSet pod", "daemonset", ds.Name, "pod", p.Name)
		}
	}
	for _, node := range nodes {
		seen[node.Name] = true
		pods := byNode[node.Name]
		if !nodeShouldRun(c.Log(), &ds.Spec.Template.Spec, tolerations, node) {
			if len(pods) > 0 {
				st.NumberMisscheduled++
			}
			for _, p := range pods {
				deletePod(p)
			}
			continue
		}
		st.DesiredNumberScheduled++
		var live []*corev1.Pod
		for _, p := range pods {
			if p.Status.Phase == corev1.PodFailed {
				deletePod(p) // recreated on a later pass
				continue
			}
			if p.DeletionTimestamp == nil {
				live = append(live, p)
			}
		}
		if len(live) == 0 {
			if len(pods) == 0 {
				obj, err := daemonPod(ds, node.Name)
				if err == nil {
					err = c.Create(podRes, ds.Namespace, obj)
				}
				c.LogErr(err, "create DaemonSet pod", "daemonset", ds.Name, "node", node.Name)
			}
			unavailable++
			continue
		}
		// One pod per Node: the oldest stays.
		oldest := live[0]
		for _, p := range live[1:] {
			if p.CreationTimestamp.Before(&oldest.CreationTimestamp) {
				oldest = p
			}
		}
		for _, p := range live {
			if p != oldest {
				deletePod(p)
			}
		}
		st.CurrentNumberScheduled++
		if PodReady(oldest) {
			st.NumberReady++
			st.NumberAvailable++
		} else {
			unavailable++
		}
		if oldest.Labels[dsTemplateGenerationLabel] == gen {
			st.UpdatedNumberScheduled++
		} else {
			outdated = append(outdated, oldest)
		}
	}
	// Pods bound to Nodes that are gone.
	for node, pods := range byNode {
		if !seen[node] {
			for _, p := range pods {
				deletePod(p)
			}
		}
	}
	if ds.Spec.UpdateStrategy.Type == appsv1.RollingUpdateDaemonSetStrategyType && len(outdated) > 0 {
		maxUnavailable := 1
		if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.MaxUnavailable != nil {
			if v, err := intstr.GetScaledValueFromIntOrPercent(ru.MaxUnavailable, int(st.DesiredNumberScheduled), true); err == nil {
				maxUnavailable = v
			}
		}
		// As the real controller: an outdated pod that is not available
		// goes at once; available ones while fewer than maxUnavailable
		// Nodes lack an available pod.
		for _, p := range outdated {
			if !PodReady(p) {
				deletePod(p)
			}
		}
		for _, p := range outdated {
			if !PodReady(p) {
				continue
			}
			if unavailable >= maxUnavailable {
				break
			}
			deletePod(p)
			unavailable++
		}
	}
	st.NumberUnavailable = st.DesiredNumberScheduled - st.NumberAvailable
	st.ObservedGeneration = ds.Generation
	st.CollisionCount = ds.Status.CollisionCount
	st.Conditions = ds.Status.Conditions
	writeDaemonSetStatus(c, dsRes, ds, &st)
}

// writeDaemonSetStatus stores the computed status.
func writeDaemonSetStatus(c Cluster, dsRes *registry.Resource, ds *appsv1.DaemonSet, st *appsv1.DaemonSetStatus) {
	out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(st)
	if err != nil {
		return
	}
	err = c.Mutate(dsRes, ds.Namespace, ds.Name, func(cur map[string]any) (store.Mutation, error) {
		if cur == nil || object.Str(object.Meta(cur), "uid") != string(ds.UID) {
			return store.Mutation{}, apierrors.NewNotFound(dsRes.GroupResource(), ds.Name)
		}
		cur["status"] = out // an equal status is a no-op for the store
		return store.Mutation{Object: cur}, nil
	})
	c.LogErr(err, "update DaemonSet status", "daemonset", ds.Name)
}

// Wakes reports changes the DaemonSet controller acts on: its DaemonSets
// (but not their status, which it writes itself), Nodes, and pods a
// DaemonSet controls.
func (DaemonSets) Wakes(ev store.Event) bool {
	switch ev.Resource {
	case "nodes":
		return true
	case "daemonsets":
		return ev.Type != "MODIFIED" || ev.Old == nil || object.SpecChanged(ev.Old.Object, ev.Object.Object)
	case "pods":
		for _, ref := range object.OwnerRefs(ev.Object.Object) {
			if ref.Controller != nil && *ref.Controller && ref.Kind == "DaemonSet" {
				return true
			}
		}
	}
	return false
}
