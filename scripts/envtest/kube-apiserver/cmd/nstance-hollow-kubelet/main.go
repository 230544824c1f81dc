// Command nstance-hollow-kubelet is the development node of Nstance: the
// real kubelet code (k8s.io/kubernetes/pkg/kubemark) over a fake container
// runtime, as Kubernetes' own scale tests run it, started by a dev
// instance's user data with the client certificate Nstance issued for the
// node. It differs from kubemark's --morph=kubelet where a dev stack on a
// laptop needs it to:
//
//   - --provider-id: the Node registers with the instance's provider ID
//     (kubemark hard-codes kubemark://NAME);
//   - --root-dir: everything it writes (kubelet root, static pods, pod logs,
//     the fake runtime's socket) lives under one directory the instance
//     owns, never under /tmp;
//   - --port 0 (the default) runs no kubelet HTTP server at all; a port
//     binds 127.0.0.1 only (kubemark binds 0.0.0.0 without authentication).
//
// It stops on SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/version"
	remote "k8s.io/cri-client/pkg"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubemark"
)

type options struct {
	name, kubeconfig, providerID, rootDir, contentType, labels string
	port, maxPods                                              int
	printVersion                                               bool
}

func main() {
	var o options
	fs := flag.NewFlagSet("nstance-hollow-kubelet", flag.ExitOnError)
	fs.StringVar(&o.name, "name", "", "node name (required)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig with the node's client certificate (required)")
	fs.StringVar(&o.providerID, "provider-id", "", "spec.providerID the Node registers with (default kubemark://NAME)")
	fs.StringVar(&o.rootDir, "root-dir", "", "directory for everything the kubelet writes (required; created)")
	fs.StringVar(&o.contentType, "content-type", "application/vnd.kubernetes.protobuf", "content type towards the API server (application/json for dev-k8s)")
	fs.StringVar(&o.labels, "node-labels", "", "extra Node labels, key=value,...")
	fs.IntVar(&o.port, "port", 0, "kubelet HTTP port on 127.0.0.1 (0: no kubelet server)")
	fs.IntVar(&o.maxPods, "max-pods", 110, "pods the node accepts")
	fs.BoolVar(&o.printVersion, "version", false, "print the Kubernetes version and exit")
	klog.InitFlags(fs)
	_ = fs.Parse(os.Args[1:])
	if o.printVersion {
		fmt.Println("nstance-hollow-kubelet", version.Get().GitVersion)
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "nstance-hollow-kubelet:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	if o.name == "" || o.kubeconfig == "" || o.rootDir == "" {
		return errors.New("--name, --kubeconfig and --root-dir are required")
	}
	if o.port < 0 || o.port > 65535 {
		return fmt.Errorf("--port %d is not a port", o.port)
	}
	root, err := filepath.Abs(o.rootDir)
	if err != nil {
		return err
	}
	for _, d := range []string{root, filepath.Join(root, "static-pods"), filepath.Join(root, "pod-logs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	labels := map[string]string{}
	if o.labels != "" {
		for _, kv := range strings.Split(o.labels, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return fmt.Errorf("--node-labels: %q is not key=value", kv)
			}
			labels[k] = v
		}
	}
	klog.InfoS("starting", "version", version.Get().GitVersion, "node", o.name, "providerID", o.providerID, "root", root)

	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("loading %s: %w", o.kubeconfig, err)
	}
	cfg.ContentType = o.contentType
	cfg.UserAgent = "nstance-hollow-kubelet"
	client, err := clientset.NewForConfig(cfg)
	if err != nil {
		return err
	}

	// The library makes its directories under /tmp; they are replaced by
	// ours at once and the ones it made are removed by their exact names.
	f, c := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{
		NodeName: o.name, KubeletPort: max(o.port, 10250), KubeletReadOnlyPort: 0, MaxPods: o.maxPods, NodeLabels: labels,
	})
	if made := f.RootDirectory; made != root && strings.HasPrefix(filepath.Base(made), "hollow-kubelet.") {
		if err := os.RemoveAll(made); err != nil {
			klog.ErrorS(err, "removing the library's temporary root", "dir", made)
		}
	}
	f.RootDirectory = root
	c.StaticPodPath = filepath.Join(root, "static-pods")
	c.PodLogsDir = filepath.Join(root, "pod-logs")
	c.Address = "127.0.0.1"
	c.EnableServer = o.port > 0
	if o.providerID != "" {
		c.ProviderID = o.providerID
	}

	hb := *cfg
	hb.Timeout = min(c.NodeStatusUpdateFrequency.Duration, time.Duration(c.NodeLeaseDurationSeconds)*time.Second)
	hb.QPS = -1
	heartbeat, err := clientset.NewForConfig(&hb)
	if err != nil {
		return err
	}

	endpoint := "unix://" + filepath.Join(root, "runtime.sock")
	_ = os.Remove(filepath.Join(root, "runtime.sock")) // left by an earlier run of this node
	rt := fakeremote.NewFakeRemoteRuntime()
	if err := rt.Start(endpoint); err != nil {
		return fmt.Errorf("starting the fake runtime: %w", err)
	}
	defer rt.Stop()
	runtimeService, err := remote.NewRemoteRuntimeService(ctx, endpoint, 15*time.Second, noop.NewTracerProvider(), false)
	if err != nil {
		return fmt.Errorf("connecting to the fake runtime: %w", err)
	}
	hk := kubemark.NewHollowKubelet(f, c, client, heartbeat, &cadvisortest.Fake{NodeName: o.name},
		rt.ImageService, runtimeService, cm.NewStubContainerManager())
	go hk.Run(ctx)
	<-ctx.Done()
	klog.InfoS("stopping", "node", o.name)
	return nil
}
