package leaderaddr

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

// LeaderLabel is the label the shard leader's pod carries (value "true")
// while it leads. The nstance-server chart's Service selects it, so
// in-cluster clients reach only the server that listens on the
// registration, operator and agent ports: the Kubernetes form of the
// shard's fixed address.
const LeaderLabel = "nstance.dev/shard-leader"

// leaderLabelPatch is the JSON merge patch that makes a pod carry
// LeaderLabel while it leads and removes it otherwise (a null value
// deletes the key; deleting an absent label is no change).
func leaderLabelPatch(leading bool) []byte {
	var v any // nil: remove
	if leading {
		v = "true"
	}
	p, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{LeaderLabel: v}}})
	if err != nil {
		panic(err) // a constant shape always marshals
	}
	return p
}

// ParsePodRef splits "namespace/name" (NSTANCE_LEADER_POD) and checks both
// parts are DNS names.
func ParsePodRef(ref string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(ref, "/")
	if !ok || namespace == "" || name == "" {
		return "", "", fmt.Errorf("leader pod %q: want namespace/name", ref)
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return "", "", fmt.Errorf("leader pod %q: namespace: %s", ref, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", "", fmt.Errorf("leader pod %q: name: %s", ref, strings.Join(errs, "; "))
	}
	return namespace, name, nil
}

// PodLabel holds the shard's address on Kubernetes: the leader labels its
// own pod with LeaderLabel on Acquire and removes the label on Release.
// Only this pod is patched (the chart's Role allows get and patch on pods
// of its namespace).
//
// A server that is killed does not remove the label, but its pod stops
// being ready (and its restarted process releases at start); a server cut
// off from storage stops serving at its renew deadline and releases, best
// effort, before a standby may take over.
type PodLabel struct {
	Pods      corev1client.PodsGetter
	Namespace string
	Name      string
	Log       logr.Logger
}

// NewPodLabel builds the holder for the pod namespace/name with cfg (the
// in-cluster configuration when nil).
func NewPodLabel(cfg *rest.Config, ref string, log logr.Logger) (*PodLabel, error) {
	ns, name, err := ParsePodRef(ref)
	if err != nil {
		return nil, err
	}
	if cfg == nil {
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("leader pod label: in-cluster Kubernetes configuration: %w", err)
		}
	}
	c, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("leader pod label: Kubernetes client: %w", err)
	}
	return &PodLabel{Pods: c, Namespace: ns, Name: name, Log: log}, nil
}

// Acquire labels this server's pod as the shard leader.
func (p *PodLabel) Acquire(ctx context.Context) error {
	if err := p.patch(ctx, true); err != nil {
		return err
	}
	p.Log.Info("labelled the pod as shard leader", "pod", p.Namespace+"/"+p.Name, "label", LeaderLabel)
	return nil
}

// Release removes the label. A pod that no longer exists holds nothing.
func (p *PodLabel) Release(ctx context.Context) error {
	err := p.patch(ctx, false)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func (p *PodLabel) patch(ctx context.Context, leading bool) error {
	_, err := p.Pods.Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, leaderLabelPatch(leading), metav1.PatchOptions{})
	if err != nil {
		verb := "label"
		if !leading {
			verb = "unlabel"
		}
		return fmt.Errorf("leader pod label: %s pod %s/%s: %w", verb, p.Namespace, p.Name, err)
	}
	return nil
}
