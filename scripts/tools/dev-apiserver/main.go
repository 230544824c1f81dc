// Command dev-apiserver runs a real kube-apiserver and etcd (the envtest
// binaries from scripts/envtest-assets.sh) with the Nstance and Cluster API
// CRDs installed, for `make dev-tmux-apiserver`: the kind experience without
// Docker. It authorizes as a production cluster does (Node,RBAC, the
// NodeRestriction admission plugin) and trusts kubelet client certificates
// of the dev node CA (--node-ca), so the dev instances' hollow kubelets join
// with the certificates Nstance issues. It writes an admin kubeconfig for the
// operator and kubectl and its serving CA for the nodes (--server-ca-out).
// With --node-dir it also mirrors the fake Node files the tmux provider
// writes (the fallback without kubelets) into real Node objects.
// SIGINT/SIGTERM stop the control plane.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

func main() {
	kubeconfigOut := flag.String("kubeconfig-out", "temp/operator/kubeconfig", "write the admin kubeconfig here")
	nodeDir := flag.String("node-dir", "", "mirror the fake Node JSON files of this directory into the cluster (empty: off)")
	nodeCA := flag.String("node-ca", "", "PEM file of the CA whose client certificates kubelets present (empty: none)")
	serverCAOut := flag.String("server-ca-out", "", "write the API server's serving CA (PEM) here for the nodes, and its URL beside it (server-url)")
	flag.Parse()
	if err := run(*kubeconfigOut, *nodeDir, *nodeCA, *serverCAOut); err != nil {
		fmt.Fprintln(os.Stderr, "dev-apiserver:", err)
		os.Exit(1)
	}
}

func run(kubeconfigOut, nodeDir, nodeCA, serverCAOut string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := kubetest.Options{APIServerArgs: map[string]string{
		"authorization-mode": "Node,RBAC", "enable-admission-plugins": "NodeRestriction",
	}}
	if nodeCA != "" {
		pem, err := os.ReadFile(nodeCA)
		if err != nil {
			return fmt.Errorf("reading --node-ca: %w", err)
		}
		opts.ClientCAs = pem
	}
	env, stopEnv, err := kubetest.StartEnvWith(opts)
	if err != nil {
		return err
	}
	defer func() {
		if err := stopEnv(); err != nil {
			fmt.Fprintln(os.Stderr, "dev-apiserver: stop:", err)
		}
	}()
	kc, err := os.ReadFile(env.Kubeconfig)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(kubeconfigOut), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(kubeconfigOut, kc, 0o600); err != nil {
		return err
	}
	if serverCAOut != "" {
		if err := os.MkdirAll(filepath.Dir(serverCAOut), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(serverCAOut, env.Config.CAData, 0o644); err != nil {
			return err
		}
		// envtest picks a free port: the nodes read it here.
		if err := os.WriteFile(filepath.Join(filepath.Dir(serverCAOut), "server-url"), []byte(env.Config.Host+"\n"), 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("kube-apiserver %s ready; kubeconfig %s (kubectl: %s)\n", env.Config.Host, kubeconfigOut, filepath.Join(env.AssetsDir, "kubectl"))
	if nodeDir == "" {
		<-ctx.Done()
		return nil
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if err := syncNodes(ctx, env.Client, nodeDir); err != nil && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "dev-apiserver: node sync:", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// syncNodes creates a Node (with its Ready status) for every file and deletes
// the Nodes it created whose file is gone.
func syncNodes(ctx context.Context, c client.Client, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	want := map[string]bool{}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		var node corev1.Node
		if err := json.Unmarshal(b, &node); err != nil {
			continue
		}
		want[node.Name] = true
		var have corev1.Node
		if err := c.Get(ctx, client.ObjectKey{Name: node.Name}, &have); err == nil {
			continue
		} else if !apierrors.IsNotFound(err) {
			return err
		}
		status := node.Status
		node.ResourceVersion, node.CreationTimestamp = "", have.CreationTimestamp
		if node.Labels == nil {
			node.Labels = map[string]string{}
		}
		node.Labels["nstance.dev/dev-node"] = "true"
		if err := c.Create(ctx, &node); err != nil {
			return fmt.Errorf("create Node %s: %w", node.Name, err)
		}
		node.Status = status
		if err := c.Status().Update(ctx, &node); err != nil {
			return fmt.Errorf("Node %s status: %w", node.Name, err)
		}
		fmt.Printf("Node %s created (%s)\n", node.Name, node.Spec.ProviderID)
	}
	var list corev1.NodeList
	if err := c.List(ctx, &list, client.MatchingLabels{"nstance.dev/dev-node": "true"}); err != nil {
		return err
	}
	for i := range list.Items {
		n := &list.Items[i]
		if !want[n.Name] {
			if err := c.Delete(ctx, n); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			fmt.Printf("Node %s deleted\n", n.Name)
		}
	}
	return nil
}
